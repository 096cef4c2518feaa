"""Helpers for the tool source tests: the test MCP server's processes, a gateway using them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agw.v1 import events_pb2 as pb
from google.protobuf import json_format

from service.providers.loopback import LoopbackProvider
from service.testing import Harness, write_agent

SERVER = Path(__file__).resolve().parent / "mcp_server.py"
#: Generous: starting a Python process that imports the SDK takes seconds on a busy machine.
CONNECT_S = 60.0

HEAD = ["request.query", "chat.start", "run.start"]
CALL = ["tool.start", "tool.args", "tool.args", "tool.end", "tool.result"]
ANSWER = ["content.start", "content.delta", "content.end", "run.complete"]
MCP_TOOLS = [
    "mcp__t__echo",
    "mcp__t__slow",
    "mcp__t__big",
    "mcp__t__grow",
    "mcp__t__steps",
    "mcp__t__crash",
    "mcp__t__facts",
]


def stdio_server(name: str = "t", **extra: Any) -> dict[str, Any]:
    """The settings of the test MCP server over stdio, named `name`."""
    return {
        "name": name,
        "transport": "stdio",
        "command": sys.executable,
        "args": [str(SERVER), "stdio"],
        "connect_timeout_s": CONNECT_S,
        "reconnect_min_s": 0.1,
        **extra,
    }


@asynccontextmanager
async def http_server(**env: str) -> AsyncIterator[str]:
    """The test MCP server over streamable HTTP in its own process; its endpoint URL."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SERVER),
        "http",
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, **env},
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), CONNECT_S)
        assert line.startswith(b"port "), line
        yield f"http://127.0.0.1:{int(line.split()[1])}/mcp"
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        await process.wait()


@asynccontextmanager
async def mcp_gateway(
    tmp_path: Path,
    provider: LoopbackProvider,
    agents: dict[str, dict[str, Any]],
    servers: list[dict[str, Any]],
    **settings: Any,
) -> AsyncIterator[Harness]:
    """A gateway on `provider` with `agents` and the MCP `servers` (started with it)."""
    agents_dir = tmp_path / "agents"
    for key, definition in agents.items():
        write_agent(agents_dir, key, definition)
    tools_dir = tmp_path / "tools"
    tools_dir.mkdir(exist_ok=True)
    async with Harness.start(
        agents_dir,
        provider,
        tools_dir=tools_dir,
        http_enabled=False,
        mcp_servers=servers,
        **settings,
    ) as gateway:
        yield gateway


async def eventually(check: Callable[[], bool], within: float = CONNECT_S) -> None:
    """Wait until `check()` holds, or fail after `within` seconds.

    It polls: a source's connection changes while nothing reads the registry.
    """
    async with asyncio.timeout(within):
        while not check():  # noqa: ASYNC110
            await asyncio.sleep(0.02)


def offered(request: dict[str, Any]) -> list[str]:
    """The names of the tools a model request offers."""
    return [tool["function"]["name"] for tool in request.get("tools", [])]


def comparable(events: Any) -> list[dict[str, Any]]:
    """Events as JSON without what differs between a live stream and its replay."""
    out = []
    for event in events:
        data = json_format.MessageToDict(event)
        for key in ("seq", "timestamp"):
            data.pop(key, None)
        out.append(data)
    return out


def snapshots(events: list[pb.Event]) -> list[tuple[str, str, str, str]]:
    """(sourceId, title, url, icon) of each `source.snapshot` event."""
    return [
        (s.source_id, s.title, s.url, s.icon)
        for s in (e.source_snapshot for e in events if e.type == "source.snapshot")
    ]
