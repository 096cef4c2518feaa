"""A small MCP server for the `demo_mcp` example agent: the time in any time zone.

It speaks MCP over stdio; the service starts it when it is configured as an MCP
server, and by default when `AGW_MCP_SERVERS` is unset and the service runs from the
repository's root, as `make run` does (docs/agents.md, "Tool sources: MCP and HTTP";
agw.toml beside this file configures it explicitly).

Tools: `now` (the date and time in an IANA time zone) and `zones` (the time zone
names that contain a text).
"""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from mcp.server.mcpserver import MCPServer

server = MCPServer("clock")


@server.tool()
def now(zone: str = "UTC") -> dict[str, str]:
    """The current date and time in an IANA time zone, e.g. "Europe/Paris"."""
    try:
        local = datetime.now(UTC).astimezone(ZoneInfo(zone))
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {zone!r}; the zones tool lists them") from None
    return {
        "zone": zone,
        "date": local.date().isoformat(),
        "time": local.strftime("%H:%M"),
        "weekday": local.strftime("%A"),
    }


@server.tool()
def zones(contains: str = "") -> list[str]:
    """The IANA time zone names that contain a text (any case), at most 50."""
    wanted = contains.lower()
    return sorted(name for name in available_timezones() if wanted in name.lower())[:50]


if __name__ == "__main__":
    server.run("stdio")
