"""One MCP server as a tool source, against the test MCP server's real process.

Its tools while connected, their calls and output limit, a server killed while
idle (seen by the ping, tools withdrawn, connected again), references resolved
into the server's environment (and masked in what comes back), a missing
variable reported, and stop.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from service.core.tools.definitions import ToolError, ToolOrigin
from service.core.tools.sources import ToolCallInfo
from service.toolsources.mcp import McpServer, McpServerOptions
from tests.toolsources.kit import CONNECT_S, MCP_TOOLS, SERVER, eventually

CALL = ToolCallInfo("run", "chat", "tool", "name")


def options(**extra: Any) -> McpServerOptions:
    values: dict[str, Any] = {
        "name": "t",
        "transport": "stdio",
        "command": sys.executable,
        "args": (str(SERVER), "stdio"),
        "connect_timeout_s": CONNECT_S,
        "reconnect_min_s": 0.5,
        **extra,
    }
    return McpServerOptions(**values)


@asynccontextmanager
async def started(opts: McpServerOptions, environ: dict[str, str]) -> AsyncIterator[McpServer]:
    server = McpServer(opts, environ=environ)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def call(server: McpServer, tool: str, **arguments: Any) -> Any:
    handler = server.handler(tool)
    assert handler is not None, f"{tool} is not offered"
    return await handler(arguments, CALL)


async def test_a_connected_server_offers_its_tools_and_runs_them() -> None:
    environ = {**os.environ, "AGW_TEST_SERVER_SECRET": "s3rver-secret"}
    opts = options(
        env={"GIVEN": "${ENV:AGW_TEST_SERVER_SECRET}"},
        max_output_bytes=64,
        icon="emoji:🧰",
        ping_interval_s=0.3,
    )
    async with started(opts, environ) as server:
        definitions = dict(server.definitions())
        assert list(definitions) == MCP_TOOLS
        assert (server.errors, server.connected, server.connections) == ({}, True, 1)
        echo = definitions["mcp__t__echo"]
        assert (echo.kind, echo.description, echo.timeout_s, echo.source) == (
            "backend",
            "Say the text back.",
            30.0,
            "MCP server 't'",
        )
        assert echo.origin == ToolOrigin("mcp:t", "t", "", "emoji:🧰")
        assert list(server.origins) == [echo.origin]
        assert await call(server, "mcp__t__echo", text="hello") == "hello"
        assert await call(server, "mcp__t__big", size=100) == (
            "x" * 64 + "\n[output cut: 100 bytes, the limit is 64]"
        )
        facts = json.loads(await call(server, "mcp__t__facts", variable="GIVEN"))
        assert (facts["length"], facts["value"]) == (13, "***")  # given, and masked
        with pytest.raises(ToolError, match=r"^MCP server 't': .*seconds"):
            await call(server, "mcp__t__slow", seconds="soon")  # the server refuses it

        version = server.version
        os.kill(facts["pid"], signal.SIGKILL)  # dies while idle: the next ping finds out
        await eventually(lambda: not server.connected)
        assert server.version > version and server.definitions() == {}
        assert server.errors == {
            "MCP server 't'": "MCP server 't': not connected (the connection closed)"
        }
        await eventually(lambda: server.connected)
        assert (server.connections, server.errors) == (2, {})
        assert list(server.definitions()) == MCP_TOOLS
    assert server.definitions() == {} and server.handler("mcp__t__echo") is None


async def test_a_server_with_a_missing_variable_is_reported_not_started() -> None:
    opts = options(env={"GIVEN": "${ENV:AGW_TEST_NOT_SET}"}, reconnect_min_s=30)
    async with started(opts, {}) as server:
        assert (server.connected, dict(server.definitions())) == (False, {})
        assert server.errors == {
            "MCP server 't'": (
                "MCP server 't': not connected (not configured: environment variable "
                "AGW_TEST_NOT_SET is not set)"
            )
        }


async def test_a_handler_kept_after_the_server_went_away_fails_cleanly() -> None:
    async with started(options(tool_prefix=""), dict(os.environ)) as server:
        assert list(server.definitions())[:2] == ["echo", "slow"]
        handler = server.handler("echo")
        assert handler is not None
    with pytest.raises(ToolError, match=r"^MCP server 't' is not connected$"):
        await handler({"text": "late"}, CALL)


async def test_a_server_that_never_answers_is_reported_after_the_connect_timeout() -> None:
    opts = options(command="/bin/sleep", args=("30",), connect_timeout_s=0.5, reconnect_min_s=30)
    async with started(opts, {}) as server:
        await eventually(lambda: bool(server.errors))  # start() waits 2.5 s at most
        assert (server.connected, dict(server.definitions())) == (False, {})
        assert server.errors == {
            "MCP server 't'": "MCP server 't': not connected (no answer within 0.5 s)"
        }
