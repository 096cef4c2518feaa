"""One MCP server as a tool source: the tools its session lists, offered as backend tools.

`McpServer` is an executing `ToolSource` (and an `OriginSource`): while its
`McpSession` is connected it defines one backend tool per tool the server
lists, named `{tool_prefix}{tool}` (`mcp__{server}__{tool}` by default,
characters a model's tool name cannot hold becoming `_`), whose call is the
server's `tools/call` through the session. A tool whose name or input schema
cannot be offered is left out and reported in `errors`; so is the reason the
server is not connected. Every definition carries the server's `ToolOrigin`
(`mcp:{server}`, with the server's own icon unless one is configured), which a
run describes with `source.snapshot` when a turn first offers one of its tools;
an agent offers all of a server's tools with `toolConfig.mcp: ["server"]`, or
some of them by name in `toolConfig.backends`. A call's time-out is the
server's `timeout_s`, kept by the tool executor like any backend tool's.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from service.core.tools.definitions import ToolDefinition, ToolOrigin, schema_issues
from service.core.tools.sources import ToolCallInfo, ToolHandler, mcp_origin_id
from service.toolsources.mcp.options import McpServerOptions
from service.toolsources.mcp.session import McpSession
from service.toolsources.references import public_url

if TYPE_CHECKING:
    from mcp.types import Implementation, Tool

log = logging.getLogger("agw.tools.mcp")

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class _Tool:
    definition: ToolDefinition
    remote_name: str  # the tool's name on the server


class McpServer:
    """One MCP server's tools, while it is connected (an executing, described source)."""

    executes = True

    def __init__(self, options: McpServerOptions, *, environ: Mapping[str, str]) -> None:
        self.options = options
        self.name = f"MCP server '{options.name}'"
        self._origin = ToolOrigin(
            mcp_origin_id(options.name),
            options.title or options.name,
            public_url(options.url) if options.transport == "http" else "",
            options.icon,
        )
        self._version = 0
        self._tools: dict[str, _Tool] = {}
        self._errors: dict[str, str] = {}
        self.session = McpSession(options, environ=environ, name=self.name, listener=self)

    # -- ToolSource ------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    @property
    def errors(self) -> Mapping[str, str]:
        return self._errors

    @property
    def origins(self) -> Sequence[ToolOrigin]:
        return (self._origin,)

    @property
    def connected(self) -> bool:
        return self.session.connected

    @property
    def connections(self) -> int:
        """Connections made so far."""
        return self.session.connections

    def definitions(self) -> Mapping[str, ToolDefinition]:
        return {name: tool.definition for name, tool in self._tools.items()}

    def handler(self, name: str) -> ToolHandler | None:
        tool = self._tools.get(name)
        if tool is None:
            return None
        remote, session = tool.remote_name, self.session

        async def run(arguments: dict[str, Any], call: ToolCallInfo) -> Any:
            return await session.call(remote, arguments, call.progress)

        return run

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start keeping the connection; returns once the first attempt succeeded or failed."""
        await self.session.start()

    async def stop(self) -> None:
        """Close the connection (a stdio server is stopped) and withdraw the tools."""
        await self.session.stop()
        self._publish({}, {})

    # -- what the session tells (its Listener) ---------------------------------------------

    def identified(self, server: Implementation) -> None:
        """Take the server's own icon for the origin, unless one is configured."""
        if not self.options.icon:
            self._origin = _with_server_icon(self._origin, server)

    def offer(self, tools: Sequence[Tool]) -> int:
        """Define the listed tools (the ones that cannot be offered are reported)."""
        offered: dict[str, _Tool] = {}
        problems: list[str] = []
        for tool in tools:
            name = self.options.prefix + re.sub(r"[^A-Za-z0-9_-]", "_", tool.name)
            schema = dict(tool.input_schema or {})
            schema.setdefault("type", "object")
            issues = schema_issues(schema)
            if not TOOL_NAME.match(name):
                problems.append(f"tool '{tool.name}': '{name}' is not a valid tool name")
            elif name in offered:
                problems.append(f"tool '{tool.name}': '{name}' is taken by another of its tools")
            elif issues:
                problems.append(f"tool '{tool.name}': inputSchema{issues[0]}")
            else:
                definition = ToolDefinition(
                    name=name,
                    kind="backend",
                    description=tool.description or tool.title or tool.name,
                    parameters=schema,
                    timeout_s=self.options.timeout_s,
                    idempotent=_idempotent(tool),
                    source=self.name,
                    origin=self._origin,
                )
                offered[name] = _Tool(definition, tool.name)
        errors = {self.name: f"{self.name}: {'; '.join(problems)}"} if problems else {}
        if problems:
            log.warning("%s: tools not offered: %s", self.name, "; ".join(problems))
        self._publish(offered, errors)
        return len(offered)

    def withdraw(self, reason: str) -> None:
        """No tools while not connected; the reason is the source's error."""
        self._publish({}, {self.name: f"{self.name}: not connected ({reason})"})

    def _publish(self, tools: dict[str, _Tool], errors: dict[str, str]) -> None:
        if tools == self._tools and errors == self._errors:
            return
        self._tools, self._errors = tools, errors
        self._version += 1


def _with_server_icon(origin: ToolOrigin, info: Any) -> ToolOrigin:
    """`origin` with the first http(s) icon the server announces, if any."""
    for icon in getattr(info, "icons", None) or ():
        src = str(getattr(icon, "src", ""))
        if src.startswith(("https://", "http://")) and len(src) <= 2048:
            return ToolOrigin(origin.source_id, origin.title, origin.url, src)
    return origin


def _idempotent(tool: Any) -> bool:
    """What the server's annotations say: a read-only tool, or one declared idempotent (MCP
    `readOnlyHint`, `idempotentHint`), may run again when a run resumes after its process
    stopped during a call."""
    hints = getattr(tool, "annotations", None)
    if hints is None:
        return False
    return bool(getattr(hints, "readOnlyHint", False) or getattr(hints, "idempotentHint", False))
