"""MCP servers as tool sources: each configured server's tools, offered as backend tools.

`McpServer` is one configured server (`McpServerOptions`), reached over stdio (a
command the service starts) or streamable HTTP (a URL), with the official `mcp`
SDK. It is an executing `ToolSource`: while connected it defines one backend tool
per tool the server lists, named `{tool_prefix}{tool}` (`mcp__{server}__{tool}` by
default, characters a model's tool name cannot hold becoming `_`), whose call is
the server's `tools/call`. Every definition carries the server's `ToolOrigin`
(`mcp:{server}`), which a run describes with `source.snapshot` when a turn first
offers one of its tools; an agent offers all of a server's tools with
`toolConfig.mcp: ["server"]`, or some of them by name in `toolConfig.backends`.

A supervisor task keeps the connection: it connects (the `initialize` handshake,
then `tools/list`, within `connect_timeout_s`), re-lists the tools when the server
sends `notifications/tools/list_changed`, and pings the server every
`ping_interval_s`. A server that cannot be started or reached, stops answering or
closes the connection (a crash, even in the middle of a call) has its tools
withdrawn and the reason in the source's `errors` and the log; the supervisor
connects again after a back-off that doubles from `reconnect_min_s` up to
`reconnect_max_s`. A call in flight when the connection closes gets an error result.

A call's result is the text of the tool's content (other content is named, not
inlined), cut to `max_output_bytes`; a result flagged `isError` is the call's
error result. The call's time-out is the server's `timeout_s`, kept by the tool
executor like any backend tool's; while a call is in flight the connection is
not pinged (a server busy with it may answer a ping late).

`${ENV:NAME}` references in the headers and in the environment given to a stdio
server are resolved at each connection; the resolved values are masked in
results and messages and never logged (the URL and the command hold no
references: the HTTP client logs the URL).

The SDK is imported when a server first connects, so a service without MCP
servers does not load it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from service.core.masking import SecretMask
from service.core.tools.definitions import (
    ToolDefinition,
    ToolError,
    ToolOrigin,
    schema_issues,
)
from service.core.tools.sources import ToolCallInfo, ToolHandler, mcp_origin_id
from service.toolsources.references import Expanded, MissingVariable, cut, public_url

if TYPE_CHECKING:
    import anyio
    from mcp import ClientSession
    from mcp.types import CallToolResult, Tool

log = logging.getLogger("agw.tools.mcp")

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_LIST_PAGES = 100
ERROR_CHARS = 500


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


class ConnectionLost(Exception):
    """The server closed the connection or stopped answering."""


@dataclass(frozen=True, slots=True)
class _Tool:
    definition: ToolDefinition
    remote_name: str  # the tool's name on the server


class McpServer:
    """One MCP server's tools, while it is connected (an executing, described source)."""

    executes = True

    def __init__(self, options: McpServerOptions, *, environ: Mapping[str, str]) -> None:
        self.options = options
        self.environ = environ
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
        self._session: ClientSession | None = None
        self._stale = False  # the server said its tools changed
        self._lost = ""  # why the connection is gone, when a call found out
        self._wake = asyncio.Event()
        self._listing = asyncio.Lock()
        self._attempted = asyncio.Event()  # the first connection attempt is over
        self._task: asyncio.Task[None] | None = None
        self._scope: anyio.CancelScope | None = None  # the supervisor's, to stop it
        self._mask = SecretMask()  # the values of the references resolved for the connection
        self._calls = 0  # calls in flight (an idle connection is pinged)
        self._delay = options.reconnect_min_s  # before the next connection attempt
        self._reported = False  # the current attempt's failure is reported
        self.connections = 0  # connections made so far

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
        return self._session is not None

    def definitions(self) -> Mapping[str, ToolDefinition]:
        return {name: tool.definition for name, tool in self._tools.items()}

    def handler(self, name: str) -> ToolHandler | None:
        tool = self._tools.get(name)
        if tool is None:
            return None
        remote = tool.remote_name

        async def run(arguments: dict[str, Any], call: ToolCallInfo) -> Any:
            return await self.call(remote, arguments)

        return run

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start keeping the connection; returns once the first attempt succeeded or failed."""
        if self._task is None:
            self._task = asyncio.create_task(self._supervise(), name=f"mcp {self.options.name}")
        wait = self.options.connect_timeout_s + 2.0
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._attempted.wait(), wait)

    async def stop(self) -> None:
        """Close the connection (a stdio server is stopped) and withdraw the tools."""
        task, self._task = self._task, None
        if task is not None:
            # Through the supervisor's cancel scope, which respects the SDK's shielded
            # teardown (a plain task.cancel() could cut it short and leave the server running).
            if self._scope is not None:
                self._scope.cancel()
            else:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._publish({}, {})

    # -- calls -----------------------------------------------------------------------------

    async def call(self, remote: str, arguments: dict[str, Any]) -> Any:
        """Call tool `remote` of the server; its result, or `ToolError`."""
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED

        session, server = self._session, self.name
        if session is None:
            raise ToolError(f"{server} is not connected")
        self._calls += 1
        try:
            result = await session.call_tool(remote, arguments)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self._lose("the connection closed during a call")
                raise ToolError(f"{server} closed the connection during the call") from None
            raise ToolError(f"{server}: {self._flat(exc.message)}") from None
        finally:
            self._calls -= 1
        await self._catch_up(session)
        return self._result(result)

    def _result(self, result: CallToolResult) -> Any:
        from mcp.types import (
            AudioContent,
            EmbeddedResource,
            ImageContent,
            ResourceLink,
            TextContent,
            TextResourceContents,
        )

        parts: list[str] = []
        for block in result.content:
            if isinstance(block, TextContent):
                parts.append(block.text)
            elif isinstance(block, ImageContent | AudioContent):
                parts.append(f"[{block.type}: {block.mime_type}, not shown]")
            elif isinstance(block, ResourceLink):
                parts.append(f"[resource: {block.uri}]")
            elif isinstance(block, EmbeddedResource):
                resource = block.resource
                if isinstance(resource, TextResourceContents):
                    parts.append(resource.text)
                else:
                    parts.append(f"[resource: {resource.uri}, not shown]")
        text = self._mask("\n".join(parts))
        if result.is_error:
            raise ToolError(f"{self.name}: {self._flat(text) or 'the tool failed'}")
        if not parts and result.structured_content is not None:
            return result.structured_content
        return cut(text, self.options.max_output_bytes)

    async def _catch_up(self, session: ClientSession) -> None:
        """Re-list the tools now if the server said they changed (e.g. during this call)."""
        await asyncio.sleep(0)  # let a notification that came with the result be handled
        if (self._stale or self._listing.locked()) and self._session is session:
            try:
                await self._relist(session)
            except Exception as exc:  # the supervisor sees the same failure and reports it
                log.debug("%s: re-listing after a call failed: %s", self.name, exc)

    # -- the connection --------------------------------------------------------------------

    async def _supervise(self) -> None:
        """Connect, serve, and connect again after a back-off, until stopped."""
        import anyio

        with anyio.CancelScope() as self._scope:
            self._delay = self.options.reconnect_min_s
            while True:
                connections, self._reported = self.connections, False
                try:
                    await self._connection()
                except Exception as exc:  # reported already, unless it came from the teardown
                    self._down(self._reason(exc))
                self._down("the connection closed")
                await asyncio.sleep(self._delay)
                if self.connections > connections:
                    self._delay = self.options.reconnect_min_s  # it was up: start again
                else:
                    self._delay = min(self._delay * 2, self.options.reconnect_max_s)

    async def _connection(self) -> None:
        """One connection: handshake, tools, then serve until it is lost (then it raises).

        A failure is reported (the tools withdrawn) before the transport is torn down,
        which may take a while (a stdio server is given time to exit).
        """
        from mcp import ClientSession

        async with AsyncExitStack() as stack:
            try:
                read, write = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(
                    ClientSession(read, write, message_handler=self._on_message)
                )
                self._stale, self._lost = False, ""
                async with asyncio.timeout(self.options.connect_timeout_s):
                    init = await session.initialize()
                    if not self.options.icon:
                        self._origin = _with_server_icon(self._origin, init.server_info)
                    tools = await _list_tools(session)
                self._session = session
                self.connections += 1
                self._offer(tools)
                log.info("%s: connected, %d tools", self.name, len(self._tools))
                self._attempted.set()
                await self._serve(session)
            except Exception as exc:
                self._session = None
                self._down(self._reason(exc))
                raise
            finally:
                self._session = None

    def _down(self, reason: str) -> None:
        """Withdraw the tools and report why (once per connection attempt)."""
        if self._reported:
            return
        self._reported = True
        log.warning("%s: %s; connecting again in %g s", self.name, reason, self._delay)
        self._publish({}, {self.name: f"{self.name}: not connected ({reason})"})
        self._attempted.set()

    async def _serve(self, session: ClientSession) -> None:
        """Re-list on change, ping when idle; return (raise) once the connection is lost."""
        while True:
            self._wake.clear()
            if self._lost:
                raise ConnectionLost(self._lost)
            if self._stale:
                await self._relist(session)
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), self.options.ping_interval_s)
            except TimeoutError:
                if self._calls:  # busy, not idle: a call finds out if the connection closes
                    continue
                try:
                    await asyncio.wait_for(session.send_ping(), self.options.connect_timeout_s)
                except TimeoutError:
                    raise ConnectionLost("the server did not answer a ping") from None

    async def _relist(self, session: ClientSession) -> None:
        """List the tools again if they changed (or once a listing under way is done)."""
        async with self._listing:
            if not self._stale:
                return
            self._stale = False
            async with asyncio.timeout(self.options.connect_timeout_s):
                tools = await _list_tools(session)
            if self._session is session:
                self._offer(tools)
                log.info("%s: tools changed, %d tools", self.name, len(self._tools))

    def _transport(self) -> AbstractAsyncContextManager[Any]:
        """The SDK transport of the server, references resolved."""
        options = self.options
        expanded = Expanded(self.environ)
        if options.transport == "stdio":
            from mcp import StdioServerParameters, stdio_client

            params = StdioServerParameters(
                command=options.command,
                args=list(options.args),
                env=expanded.mapping(options.env),
                cwd=options.cwd or None,
            )
            self._mask = expanded.mask()
            return stdio_client(params, errlog=_errlog())
        headers = expanded.mapping(options.headers)
        self._mask = expanded.mask()
        return _http_transport(options.url, headers)

    async def _on_message(self, message: Any) -> None:
        from mcp.types import ToolListChangedNotification

        if isinstance(message, ToolListChangedNotification):
            self._stale = True
            self._wake.set()
        elif isinstance(message, Exception):
            log.debug("%s: transport error: %s", self.name, type(message).__name__)

    def _flat(self, text: str) -> str:
        """`text` masked, on one line, at most `ERROR_CHARS` characters."""
        flat = " ".join(self._mask(text).split())
        return flat if len(flat) <= ERROR_CHARS else flat[:ERROR_CHARS] + "…"

    def _lose(self, reason: str) -> None:
        if not self._lost:
            self._lost = reason
        self._wake.set()

    # -- tools -----------------------------------------------------------------------------

    def _offer(self, tools: Sequence[Tool]) -> None:
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
                    source=self.name,
                    origin=self._origin,
                )
                offered[name] = _Tool(definition, tool.name)
        errors = {self.name: f"{self.name}: {'; '.join(problems)}"} if problems else {}
        if problems:
            log.warning("%s: tools not offered: %s", self.name, "; ".join(problems))
        self._publish(offered, errors)

    def _publish(self, tools: dict[str, _Tool], errors: dict[str, str]) -> None:
        if tools == self._tools and errors == self._errors:
            return
        self._tools, self._errors = tools, errors
        self._version += 1

    def _reason(self, exc: BaseException) -> str:
        """Why a connection failed, in words that hold no resolved secret."""
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED

        if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            return self._reason(exc.exceptions[0])
        if isinstance(exc, ConnectionLost):
            return str(exc)
        if isinstance(exc, MissingVariable):
            return f"not configured: {exc}"
        if isinstance(exc, TimeoutError):
            return f"no answer within {self.options.connect_timeout_s:g} s"
        if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED:
            return "the connection closed"
        if isinstance(exc, MCPError):
            return f"the server failed: {self._flat(exc.message)}"
        if isinstance(exc, OSError) and self.options.transport == "stdio":
            return f"cannot start {self.options.command!r}: {exc.strerror or type(exc).__name__}"
        return f"{type(exc).__name__}"


async def _list_tools(session: ClientSession) -> list[Tool]:
    """Every tool the server lists, page after page."""
    from mcp.types import PaginatedRequestParams

    tools: list[Tool] = []
    cursor: str | None = None
    for _ in range(MAX_LIST_PAGES):
        params = PaginatedRequestParams(cursor=cursor) if cursor else None
        result = await session.list_tools(params=params)
        tools += result.tools
        cursor = result.next_cursor
        if not cursor:
            break
    return tools


@contextlib.asynccontextmanager
async def _http_transport(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    """The streamable HTTP transport with its own HTTP client (and the headers)."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    client = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0))
    async with client, streamable_http_client(url, http_client=client) as streams:
        yield streams


def _with_server_icon(origin: ToolOrigin, info: Any) -> ToolOrigin:
    """`origin` with the first http(s) icon the server announces, if any."""
    for icon in getattr(info, "icons", None) or ():
        src = str(getattr(icon, "src", ""))
        if src.startswith(("https://", "http://")) and len(src) <= 2048:
            return ToolOrigin(origin.source_id, origin.title, origin.url, src)
    return origin


def _errlog() -> Any:
    """Where a stdio server's stderr goes: the service's own standard error."""
    return sys.__stderr__ if sys.__stderr__ is not None else sys.stderr
