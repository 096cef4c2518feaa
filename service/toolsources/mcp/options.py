"""One MCP server as configured: plain values, `${ENV:NAME}` references unresolved."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True, slots=True)
class McpServerOptions:
    """One MCP server as configured (plain values; `${ENV:NAME}` references unresolved)."""

    name: str
    transport: Literal["stdio", "http"]
    command: str = ""  # stdio: the program, and its arguments, environment, directory
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = ""
    url: str = ""  # http: the streamable HTTP endpoint (no credentials), and the headers sent
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 30.0  # a call
    tool_prefix: str | None = None  # None: "mcp__{name}__"
    title: str = ""  # default: the name
    icon: str = ""  # a URL or "emoji:..."; default: the server's own icon URL, if any
    connect_timeout_s: float = 10.0
    max_output_bytes: int = 64 * 1024
    ping_interval_s: float = 10.0
    reconnect_min_s: float = 1.0
    reconnect_max_s: float = 60.0

    @property
    def prefix(self) -> str:
        return f"mcp__{self.name}__" if self.tool_prefix is None else self.tool_prefix
