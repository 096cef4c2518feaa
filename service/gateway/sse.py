"""A server-streaming call answered as Server-Sent Events.

Each message of the call is one SSE message, written and flushed at once:
`id: <seq>` (when the message has a non-zero `seq`, so `Last-Event-ID` resumes
from it) and `data: <the message as one line of JSON>`. A comment
(`: heartbeat`) goes out after every `heartbeat_s` of silence, so idle-timeout
proxies keep the connection; `Cache-Control: no-cache` and
`X-Accel-Buffering: no` keep proxies from buffering.

The status line waits until the call answers: its first message opens the
stream (200), its status ends it, so a call refused before its first message —
at once or, on a loaded service, seconds later — is answered as a plain JSON
error envelope with the mapped HTTP status (a call that ends empty is
`204 No Content`, which also tells an `EventSource` not to reconnect). Only a
call that says nothing for `heartbeat_s` (a query waiting for its chat) is
taken as accepted and opened with a heartbeat comment, which sends the
headers. A service that accepts a call before it has a message sends its
headers (Attach at the live end does): the stream then opens after
`OPEN_WAIT_S` unless the status follows — a refusal's status comes right
behind its headers, though not always in the same read. Once the stream is
open, a failure becomes a last message `event: error` carrying the same
envelope.

Backpressure: the next message is read from the call only after the previous
one was written, and a write that cannot finish within `write_timeout_s` (the
client stopped reading) aborts the connection. The adapter thus holds at most
one message and the transport's bounded buffer per stream; a slow reader stalls
the gRPC call's flow control instead of the adapter's memory. Whenever the
handler ends — done, failed, or the client gone — the call is cancelled, which
the service treats per its disconnect policy (cancel the run, or detach).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import grpc
import orjson
from aiohttp import web
from google.protobuf.message import Message

from service.gateway import codec
from service.gateway.status import retry_after, rpc_failure

log = logging.getLogger("agw.http")

HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
HEARTBEAT = b": heartbeat\n\n"
#: How long a call that sent only its headers may keep the status line waiting.
OPEN_WAIT_S = 0.5


def frame(data: bytes, *, event_id: int = 0, event: str = "") -> bytes:
    """One SSE message; `data` must be a single line (compact JSON is)."""
    head = b""
    if event:
        head += b"event: " + event.encode() + b"\n"
    if event_id:
        head += b"id: %d\n" % event_id
    return head + b"data: " + data + b"\n\n"


class ClientGone(Exception):
    """The client went away or stopped reading."""


class EventStream:
    """One SSE response fed by one server-streaming call; counts what it sent."""

    def __init__(
        self,
        request: web.Request,
        call: Any,  # grpc.aio.UnaryStreamCall
        *,
        heartbeat_s: float,
        write_timeout_s: float,
        event_id: Callable[[Message], int] | None = None,
    ) -> None:
        self.request = request
        self.call = call
        self.heartbeat_s = heartbeat_s
        self.write_timeout_s = write_timeout_s
        self.event_id = event_id
        self.response: web.StreamResponse | None = None
        self.sent_events = 0
        self.sent_bytes = 0
        self.heartbeats = 0
        self.max_buffered = 0  # largest transport write buffer seen after a write, in bytes
        self.end_reason = ""  # "complete", "error", "client gone", "write timeout", "cancelled"
        self.closed = asyncio.Event()
        self._last_write = asyncio.get_running_loop().time()
        self._writing_since = 0.0  # when the relay's pending write began; 0 when none

    async def serve(self) -> web.StreamResponse:
        """Relay the call until it ends or the client goes away."""
        first: asyncio.Future[Any] = asyncio.ensure_future(self.call.read())
        opened: asyncio.Future[Any] = asyncio.ensure_future(self.call.initial_metadata())
        beat: asyncio.Task[None] | None = None
        try:
            await self._open(first, opened)
            beat = asyncio.create_task(self._beat())
            try:
                # The hot loop: read, write, read... with no task or timer per message.
                message = await first
                while message is not grpc.aio.EOF:
                    await self._write(self._frame(message))
                    self.sent_events += 1
                    message = await self.call.read()
            except grpc.aio.AioRpcError as error:
                return await self._fail(error)
            self.end_reason = "complete"
            return self.response or web.Response(status=204)
        except ClientGone as gone:
            self._gone(gone)
            return self.response or web.Response(status=499)
        except asyncio.CancelledError:
            self.end_reason = self.end_reason or "cancelled"
            raise
        finally:
            if beat is not None:
                beat.cancel()
            for future in (first, opened):
                if future.done() and not future.cancelled():
                    future.exception()  # retrieved: a failed call was answered above
                future.cancel()
            self.call.cancel()
            self.closed.set()

    async def _beat(self) -> None:
        """Heartbeats on silence, and the watchdog of the relay's writes.

        A relay write that has not finished within `write_timeout_s` (the client
        stopped reading) drops the connection; a heartbeat carries its own time-out.
        Watching from here keeps timers off the per-message path.
        """
        loop = asyncio.get_running_loop()
        check = min(self.heartbeat_s, self.write_timeout_s)
        try:
            while True:
                now = loop.time()
                since = self._writing_since
                if since:
                    if now - since >= self.write_timeout_s:
                        raise ClientGone("write timeout")
                    wake = since + self.write_timeout_s
                elif self.response is not None and now - self._last_write >= self.heartbeat_s:
                    async with asyncio.timeout(self.write_timeout_s):
                        await self._write(HEARTBEAT, relay=False)
                    self.heartbeats += 1
                    continue
                else:
                    wake = self._last_write + self.heartbeat_s
                delay = wake - now
                await asyncio.sleep(min(delay, check) if delay > 0 else check)
        except TimeoutError:
            self._gone(ClientGone("write timeout"))
        except ClientGone as gone:  # the handler is then cancelled by the connection's loss
            self._gone(gone)

    def _gone(self, gone: ClientGone) -> None:
        if not self.end_reason:
            self.end_reason = str(gone)
            log.info("SSE client of %s: %s; closing", self.request.path, gone)
        if self.request.transport is not None:
            self.request.transport.abort()

    async def _open(self, first: asyncio.Future[Any], opened: asyncio.Future[Any]) -> None:
        """Wait for the call's answer; open the stream early only when it is accepted but silent."""
        pending = {first, opened}
        await asyncio.wait(pending, timeout=self.heartbeat_s, return_when=asyncio.FIRST_COMPLETED)
        if not first.done() and opened.done():  # headers alone: accepted, or a status behind
            if self.call.done():  # ended without a message: its status decides
                await asyncio.wait({first})
            else:
                await asyncio.wait({first}, timeout=min(self.heartbeat_s, OPEN_WAIT_S))
        if first.done():
            return
        await self._write(HEARTBEAT)
        self.heartbeats += 1

    def _frame(self, message: Message) -> bytes:
        event_id = self.event_id(message) if self.event_id is not None else 0
        return frame(codec.to_json(message), event_id=event_id)

    async def _fail(self, error: grpc.aio.AioRpcError) -> web.StreamResponse:
        self.end_reason = "error"
        status, envelope = rpc_failure(error)
        if self.response is None:
            return web.Response(
                status=status,
                body=orjson.dumps(envelope),
                content_type="application/json",
                headers=retry_after(envelope),
            )
        log.info("stream %s ended with %s", self.request.path, error.code().name)
        await self._write(frame(orjson.dumps(envelope), event="error"))
        return self.response

    async def _write(self, data: bytes, *, relay: bool = True) -> None:
        """Write `data` at once; the transport's buffer is bounded (aiohttp drains it).

        No lock is needed: a write hands its bytes to the transport before it may
        wait, so the relay and a heartbeat never interleave inside a message.
        """
        loop = asyncio.get_running_loop()
        if relay:
            self._writing_since = loop.time()
        try:
            if self.response is None:
                response = web.StreamResponse(headers=HEADERS)
                await response.prepare(self.request)
                self.response = response
            await self.response.write(data)
        except ConnectionError:
            raise ClientGone("client gone") from None
        finally:
            if relay:
                self._writing_since = 0.0
        self.sent_bytes += len(data)
        self._last_write = loop.time()
        transport = self.request.transport
        if transport is not None:
            self.max_buffered = max(self.max_buffered, transport.get_write_buffer_size())
