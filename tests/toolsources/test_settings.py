"""AGW_MCP_SERVERS: the MCP servers configured, as the assembly hands them to their sources."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from pydantic import ValidationError

from service.assembly.app import mcp_options
from service.assembly.config import Settings
from service.toolsources.mcp import McpServerOptions

ROOT = Path(__file__).resolve().parents[2]
CLOCK = {"name": "clock", "command": "python", "args": ["examples/mcp/clock_server.py"]}


def test_servers_come_from_the_environment_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    search = {
        "name": "search",
        "transport": "http",
        "url": "https://mcp.example.com/mcp",
        "headers": {"Authorization": "Bearer ${ENV:SEARCH_TOKEN}"},
        "tool_prefix": "",
        "timeout_s": 5,
    }
    monkeypatch.setenv("AGW_MCP_SERVERS", json.dumps([CLOCK, search]))
    settings = Settings()
    assert [mcp_options(server) for server in settings.mcp_servers] == [
        McpServerOptions(
            name="clock",
            transport="stdio",
            command="python",
            args=("examples/mcp/clock_server.py",),
        ),
        McpServerOptions(
            name="search",
            transport="http",
            url="https://mcp.example.com/mcp",
            headers={"Authorization": "Bearer ${ENV:SEARCH_TOKEN}"},
            tool_prefix="",
            timeout_s=5.0,
        ),
    ]
    assert mcp_options(settings.mcp_servers[0]).prefix == "mcp__clock__"
    assert mcp_options(settings.mcp_servers[1]).prefix == ""


@pytest.mark.parametrize(
    ("servers", "message"),
    [
        ([CLOCK, CLOCK], "MCP server names must be unique: clock"),
        ([{"name": "x"}], "MCP server 'x': a stdio server needs a command"),
        ([{"name": "x", "transport": "http"}], "MCP server 'x': an http server needs a url"),
        (
            [{"name": "x", "transport": "http", "url": "https://h/mcp?k=${ENV:K}"}],
            "MCP server 'x': put credentials in headers, not the url",
        ),
        ([{"name": "a b", "command": "c"}], "String should match pattern"),
    ],
)
def test_bad_servers_are_refused(servers: list[dict[str, object]], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(mcp_servers=servers)


def test_the_example_configuration_starts_the_example_server() -> None:
    with (ROOT / "examples" / "mcp" / "agw.toml").open("rb") as file:
        settings = Settings(**tomllib.load(file))
    assert [mcp_options(server) for server in settings.mcp_servers] == [
        McpServerOptions(
            name="clock",
            transport="stdio",
            command=".venv/bin/python",
            args=("examples/mcp/clock_server.py",),
            timeout_s=10.0,
        )
    ]
    assert (ROOT / "examples" / "mcp" / "clock_server.py").is_file()
