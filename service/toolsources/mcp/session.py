"""The connection to one MCP server, kept by a supervisor task, with the official `mcp` SDK.

`McpSession` reaches the server over stdio (a command the service starts) or
streamable HTTP (a URL). Its supervisor task connects (the `initialize`
handshake, then `tools/list`, within `connect_timeout_s`), re-lists the tools
when the server sends `notifications/tools/list_changed`, and pings the server
every `ping_interval_s`. A server that cannot be started or reached, stops
answering or closes the connection (a crash, even in the middle of a call) has
its tools withdrawn and the reason reported; the supervisor connects again
after a back-off that doubles from `reconnect_min_s` up to `reconnect_max_s`. A
call in flight when the connection closes gets an error result.

What the session learns it tells its `Listener` (the source face, `McpServer`):
who the server is, the tools it lists, and that they are withdrawn (and why).

A call's result is the text of the tool's content (other content is named, not
inlined), cut to `max_output_bytes`; a result flagged `isError` is the call's
error result. While a call is in flight the connection is not pinged (a server
busy with it may answer a ping late).

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
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import TYPE_CHECKING, Any, Protocol

from service.core.masking import SecretMask
from service.core.tools.definitions import ToolError
from service.core.tools.sources import ProgressReport
from service.toolsources.mcp.options import McpServerOptions
from service.toolsources.references import Expanded, MissingVariable, cut

if TYPE_CHECKING:
    import anyio
    from mcp import ClientSession
    from mcp.types import CallToolResult, Implementation, Tool

log = logging.getLogger("agw.tools.mcp")

MAX_LIST_PAGES = 100
ERROR_CHARS = 500


class ConnectionLost(Exception):
    """The server closed the connection or stopped answering."""


class Listener(Protocol):
    """What a session tells the source it serves."""

    def identified(self, server: Implementation) -> None:
        """The server answered the handshake: its name, version and icons."""
        ...

    def offer(self, tools: Sequence[Tool]) -> int:
        """The server listed `tools` (on connecting, and when they changed); how many are
        offered."""
        ...

    def withdraw(self, reason: str) -> None:
        """The server is not connected (for `reason`): its tools are gone."""
        ...


class McpSession:
    """One server's connection, kept (connected again after a back-off) until stopped."""

    def __init__(
        self,
        options: McpServerOptions,
        *,
        environ: Mapping[str, str],
        name: str,
        listener: Listener,
    ) -> None:
        self.options = options
        self.environ = environ
        self.name = name
        self._listener = listener
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

    @property
    def connected(self) -> bool:
        return self._session is not None

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start keeping the connection; returns once the first attempt succeeded or failed."""
        if self._task is None:
            self._task = asyncio.create_task(self._supervise(), name=f"mcp {self.options.name}")
        wait = self.options.connect_timeout_s + 2.0
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._attempted.wait(), wait)

    async def stop(self) -> None:
        """Close the connection (a stdio server is stopped)."""
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

    # -- calls -----------------------------------------------------------------------------

    async def call(
        self, remote: str, arguments: dict[str, Any], progress: ProgressReport | None = None
    ) -> Any:
        """Call tool `remote` of the server; its result, or `ToolError`. The server's
        progress notifications for the call are reported to `progress` as they come."""
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED

        session, server = self._session, self.name
        if session is None:
            raise ToolError(f"{server} is not connected")
        self._calls += 1
        try:
            result = await session.call_tool(
                remote, arguments, progress_callback=self._progress(progress)
            )
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self._lose("the connection closed during a call")
                raise ToolError(f"{server} closed the connection during the call") from None
            raise ToolError(f"{server}: {self._flat(exc.message)}") from None
        finally:
            self._calls -= 1
        await self._catch_up(session)
        return self._result(result)

    def _progress(self, report: ProgressReport | None) -> Any:
        """The SDK's progress callback reporting to `report` (None: none asked)."""
        if report is None:
            return None

        async def progressed(progress: float, total: float | None, message: str | None) -> None:
            report(self._mask(message or ""), progress=progress, total=total)

        return progressed

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
                    self._listener.identified(init.server_info)
                    tools = await _list_tools(session)
                self._session = session
                self.connections += 1
                offered = self._listener.offer(tools)
                log.info("%s: connected, %d tools", self.name, offered)
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
        self._listener.withdraw(reason)
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
                offered = self._listener.offer(tools)
                log.info("%s: tools changed, %d tools", self.name, offered)

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


def _errlog() -> Any:
    """Where a stdio server's stderr goes: the service's own standard error."""
    return sys.__stderr__ if sys.__stderr__ is not None else sys.stderr
