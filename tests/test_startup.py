"""`python -m service` as a user runs it: what it cannot start with is one line naming the
setting to change (exit code 2, no traceback), and `make run` serves the example MCP server.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc

from service.assembly.config import EXAMPLE_MCP_SERVER, Settings
from tests.core.tools.kit import result_of
from tests.workers.conftest import launch

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 30


def environment(tmp_path: Path, **settings: str) -> dict[str, str]:
    """The process's environment: no AGW_ setting of ours but `settings`, free ports."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGW_")}
    defaults = {
        "AGW_GRPC_ADDRESS": "127.0.0.1:0",
        "AGW_HTTP_ADDRESS": "127.0.0.1:0",
        "AGW_DATA_DIR": str(tmp_path / "data"),
        "AGW_BASH_WORKING_DIR": str(tmp_path / "workspace"),
        "AGW_AGENTS_WATCH": "false",
    }
    return {**env, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'gen'}", **defaults, **settings}


async def start_refused(tmp_path: Path, **settings: str) -> str:
    """Run `python -m service` (in `tmp_path`: no example server, no agw.toml) with
    `settings`, which it must refuse; what it printed."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "service",
        cwd=tmp_path,
        env=environment(tmp_path, **settings),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), START_TIMEOUT_S)
    assert process.returncode == 2, output.decode()
    return output.decode()


def the_one_line(output: str) -> str:
    """The output's only line (no traceback, nothing else), without its time stamp."""
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert "Traceback" not in output
    return lines[0].split(" ", 2)[2]  # after the date and time


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another process (this one) listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


async def test_a_busy_grpc_port_names_the_setting(tmp_path: Path, busy_port: int) -> None:
    output = await start_refused(tmp_path, AGW_GRPC_ADDRESS=f"127.0.0.1:{busy_port}")
    assert the_one_line(output) == (
        f"ERROR   agw: cannot start: cannot listen for gRPC on 127.0.0.1:{busy_port} (in use "
        "by another process, or not an address of this host): set AGW_GRPC_ADDRESS to "
        f"another address, e.g. 127.0.0.1:{busy_port + 1}"
    )


async def test_a_busy_http_port_names_the_setting(tmp_path: Path, busy_port: int) -> None:
    output = await start_refused(tmp_path, AGW_HTTP_ADDRESS=f"127.0.0.1:{busy_port}")
    line = the_one_line(output)
    assert line.startswith(
        f"ERROR   agw: cannot start: cannot listen for HTTP on 127.0.0.1:{busy_port}"
    )
    assert line.endswith(
        f"set AGW_HTTP_ADDRESS to another address, e.g. 127.0.0.1:{busy_port + 1} "
        "(or AGW_HTTP_ENABLED=false for no HTTP API and page)"
    )


async def test_a_network_address_without_authentication_names_the_settings(
    tmp_path: Path,
) -> None:
    output = await start_refused(tmp_path, AGW_GRPC_ADDRESS="0.0.0.0:0")
    assert the_one_line(output) == (
        "ERROR   agw: cannot start: refusing to serve 0.0.0.0:0 without authentication: "
        "configure AGW_AUTH_API_KEYS or AGW_AUTH_JWT_* (see docs/security.md), or set "
        "AGW_ALLOW_UNAUTHENTICATED=true if another layer authenticates callers"
    )


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (
            "",
            "AGW_MCP_SERVERS is set but empty: give it a JSON value (e.g. [] for none) or unset it",
        ),
        ("[{", "AGW_MCP_SERVERS is not valid JSON ('[{'): correct it or unset it"),
        (
            '[{"name": "clock"}]',
            "AGW_MCP_SERVERS[0]: Value error, MCP server 'clock': a stdio server needs a command",
        ),
    ],
)
async def test_unreadable_mcp_servers_name_the_setting(
    tmp_path: Path, value: str, said: str
) -> None:
    output = await start_refused(tmp_path, AGW_MCP_SERVERS=value)
    assert the_one_line(output) == f"ERROR   agw: cannot start: {said}"


def test_the_example_mcp_server_is_served_unless_servers_are_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("AGW_MCP_SERVERS", raising=False)
    monkeypatch.chdir(ROOT)
    [clock] = Settings().mcp_server_list
    assert (clock.name, clock.command, clock.args) == (
        "clock",
        sys.executable,
        [str(EXAMPLE_MCP_SERVER)],
    )
    assert Settings(mcp_servers=[]).mcp_server_list == []
    monkeypatch.chdir(tmp_path)  # elsewhere there is no example to serve
    assert Settings().mcp_server_list == []


async def test_make_run_serves_the_mcp_example_agent(tmp_path: Path) -> None:
    """From the repository's root with no MCP setting, as `make run`: demo_mcp works."""
    env = environment(tmp_path, AGW_DEMO_DELAY_MS="0", AGW_HTTP_ENABLED="false")
    process, port = await launch(tmp_path, env, cwd=ROOT)
    try:
        target = f"127.0.0.1:{port}"
        async with grpc.aio.insecure_channel(target) as channel:
            stub = gateway_pb2_grpc.AgentGatewayStub(channel)
            request = gw.QueryRequest(agent_key="demo_mcp", message="What time is it in Tokyo?")
            events = [event async for event in stub.Query(request, timeout=START_TIMEOUT_S)]
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), START_TIMEOUT_S)
    assert events[-1].type == "run.complete", events[-1]
    called = [e.tool_start.tool_name for e in events if e.type == "tool.start"]
    assert called == ["mcp__clock__zones", "mcp__clock__now"]
    zones, local = [result_of(e) for e in events if e.type == "tool.result"]
    assert zones == "Asia/Tokyo"  # the city the user named, asked of the MCP server
    assert json.loads(local)["zone"] == "Asia/Tokyo"
