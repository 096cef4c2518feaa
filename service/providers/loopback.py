"""A fake model API server on loopback, on plain `asyncio.start_server`.

Serves `POST /v1/chat/completions` (OpenAI), `POST /v1/messages` (Anthropic) and
`POST /v1beta/models/{model}:streamGenerateContent` (Gemini) — Content-Length bodies —
as a chunked `text/event-stream`, and `GET /v1/models`, over HTTP/1.1 keep-alive. Each
request plays a *script*: chunk dicts (sent as `data: <json>`), raw bytes,
`Pause`, `Gate`, `DONE`, `CLOSE`, or a lone `HttpError`. Every item is written
and drained as it is produced. While a script plays, a concurrent read on the
connection notices a client that goes away and stops the script at once
(`disconnects` counts these). Used by tests, benchmarks and the demo provider.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
)
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, TypeAlias

logger = logging.getLogger("agw.loopback")


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


DONE = _Marker("DONE")  # sends `data: [DONE]`
CLOSE = _Marker("CLOSE")  # drops the connection mid-body
_END = _Marker("END")


@dataclass(frozen=True, slots=True)
class Pause:
    """Wait `seconds` before the next item."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Gate:
    """Wait until `event` is set before the next item."""

    event: asyncio.Event


@dataclass(frozen=True, slots=True)
class HttpError:
    """As a script's only item: answer with this status and body instead of a stream."""

    status: int
    body: dict[str, Any] | str = ""
    headers: dict[str, str] | None = None
    content_type: str = ""  # default: application/json for a dict, text/plain for a str


ScriptItem: TypeAlias = dict[str, Any] | bytes | Pause | Gate | HttpError | _Marker
Script: TypeAlias = Iterable[ScriptItem] | AsyncIterable[ScriptItem]
Responder: TypeAlias = Callable[[dict[str, Any]], Script | Awaitable[Script]]

_STREAMING_PATHS = ("/chat/completions", "/messages")  # and Gemini's ":streamGenerateContent"
_MAX_HEAD = 64 * 1024
_MAX_BODY = 64 * 1024 * 1024
_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
    b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
)


class _Closed(Exception):
    """The script asked to drop the connection."""


class LoopbackProvider:
    """The server. Scripts come from `responder(body)` or, without one, FIFO from `enqueue`."""

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        models: Iterable[str] = ("loopback",),
        max_recorded: int = 10_000,
    ) -> None:
        self.responder = responder
        self.models = list(models)
        self.requests: list[dict[str, Any]] = []  # bodies received (bounded by max_recorded)
        self.request_headers: list[dict[str, str]] = []  # their headers, names lower-cased
        self.request_targets: list[str] = []  # their paths, with the query
        self.connections_opened = 0
        self.connections_closed = 0
        self.disconnects = 0  # clients that closed their connection while a script played
        self._max_recorded = max(2, max_recorded)
        self._queue: deque[Script] = deque()
        self._server: asyncio.Server | None = None
        self._host = "127.0.0.1"
        self._port = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._changed = asyncio.Event()

    # -- control -----------------------------------------------------------------------

    def enqueue(self, *scripts: Script) -> None:
        """Queue scripts for the next requests, one script per request."""
        self._queue.extend(scripts)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> LoopbackProvider:
        """Listen on host:port (port 0 picks a free one)."""
        self._server = await asyncio.start_server(self._accept, host, port, limit=_MAX_HEAD)
        self._host, self._port = self._server.sockets[0].getsockname()[:2]
        return self

    async def stop(self) -> None:
        """Stop listening and drop every connection."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        if server is not None:
            await server.wait_closed()

    async def __aenter__(self) -> LoopbackProvider:
        return self if self._server is not None else await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """Base URL up to /v1."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}/v1"

    @property
    def open_connections(self) -> int:
        return self.connections_opened - self.connections_closed

    async def wait_connections(self, at_most: int = 0, timeout: float = 1.0) -> None:  # noqa: ASYNC109
        """Wait until at most `at_most` connections are open; TimeoutError otherwise."""
        await self._wait(
            lambda: self.open_connections <= at_most, timeout, f"<= {at_most} open connection(s)"
        )

    async def wait_closed_connections(self, timeout: float = 1.0, *, at_most: int = 0) -> None:  # noqa: ASYNC109
        """Wait until every connection (but `at_most`) is closed; TimeoutError otherwise."""
        await self.wait_connections(at_most, timeout)

    async def wait_disconnects(self, count: int = 1, timeout: float = 1.0) -> None:  # noqa: ASYNC109
        """Wait until `count` clients in total went away mid-script; TimeoutError otherwise."""
        await self._wait(lambda: self.disconnects >= count, timeout, f"{count} disconnect(s)")

    async def _wait(self, done: Callable[[], bool], timeout: float, what: str) -> None:  # noqa: ASYNC109
        try:
            async with asyncio.timeout(timeout):
                while not done():
                    await self._changed.wait()
        except TimeoutError:
            raise TimeoutError(f"loopback: {what} not seen within {timeout}s") from None

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # -- HTTP --------------------------------------------------------------------------

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A plain callback owning its task: asyncio 3.11 mishandles cancelled handler tasks.
        task = asyncio.get_running_loop().create_task(self._connection(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        self.connections_opened += 1
        self._notify()
        conn = _Conn(reader)
        try:
            while await self._request(conn, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            logger.exception("loopback: connection failed")
        finally:
            self._writers.discard(writer)
            writer.close()
            self.connections_closed += 1
            self._notify()

    async def _request(self, conn: _Conn, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False when the connection must be closed."""
        head = await conn.read_head()
        if head is None:
            return False
        try:
            method, target, keep_alive, headers, length = _parse_head(head)
        except ValueError as exc:
            _respond(writer, HttpError(400, _err(f"bad request: {exc}")), keep_alive=False)
            return False
        if length > _MAX_BODY:
            _respond(writer, HttpError(413, _err("body too large")), keep_alive=False)
            return False
        body = await conn.read_exact(length)
        path = target.split("?", 1)[0].rstrip("/")
        if method == "POST" and (path.endswith(_STREAMING_PATHS) or ":streamGenerate" in path):
            try:
                payload = json.loads(body)
                if not isinstance(payload, dict):
                    raise ValueError("not an object")
            except ValueError as exc:
                _respond(writer, HttpError(400, _err(f"invalid JSON body: {exc}")), keep_alive)
            else:
                self._record(payload, headers, target)
                return await self._play(conn, writer, await self._script(payload), keep_alive)
        elif method == "GET" and path.endswith("/models"):
            data = [
                {"id": m, "object": "model", "created": 0, "owned_by": "loopback"}
                for m in self.models
            ]
            _respond(writer, HttpError(200, {"object": "list", "data": data}), keep_alive)
        else:
            _respond(writer, HttpError(404, _err(f"no route for {method} {path}")), keep_alive)
        await writer.drain()
        return keep_alive

    def _record(self, payload: dict[str, Any], headers: dict[str, str], target: str) -> None:
        if len(self.requests) >= self._max_recorded:
            del self.requests[: self._max_recorded // 2]
            del self.request_headers[: self._max_recorded // 2]
            del self.request_targets[: self._max_recorded // 2]
        self.requests.append(payload)
        self.request_headers.append(headers)
        self.request_targets.append(target)
        self._notify()

    async def _script(self, payload: dict[str, Any]) -> Script:
        if self.responder is None:
            if self._queue:
                return self._queue.popleft()
            return [HttpError(500, _err("loopback: no script queued for this request"))]
        try:
            script = self.responder(payload)
            if isinstance(script, Awaitable):
                script = await script
        except Exception as exc:
            logger.exception("loopback: responder failed")
            return [HttpError(500, _err(f"loopback: responder failed: {exc!r}"))]
        return script

    async def _play(
        self, conn: _Conn, writer: asyncio.StreamWriter, script: Script, keep_alive: bool
    ) -> bool:
        items = _aiter(script)
        try:
            first = await anext(items, _END)
            if isinstance(first, HttpError):
                _respond(writer, first, keep_alive)
                await writer.drain()
                return keep_alive
            writer.write(_STREAM_HEAD + (b"\r\n" if keep_alive else b"Connection: close\r\n\r\n"))
            play = asyncio.create_task(_send(writer, first, items))
            watch = asyncio.create_task(conn.watch_eof())
            try:
                await asyncio.wait((play, watch), return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in (play, watch):
                    t.cancel()
                await asyncio.wait((play, watch))
        finally:
            await items.aclose()
        exc = None if play.cancelled() else play.exception()
        if not play.cancelled() and exc is None:
            return keep_alive
        if not watch.cancelled() or isinstance(exc, ConnectionError):
            self.disconnects += 1
            self._notify()
            return False
        if not isinstance(exc, _Closed | ConnectionError):
            logger.error("loopback: script failed: %r", exc)
        return False


class _Conn:
    """A reader with a push-back buffer, so that a concurrent EOF watch loses no bytes."""

    __slots__ = ("buf", "reader")

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self.buf = bytearray()

    async def read_head(self) -> bytes | None:
        while True:
            while self.buf[:2] == b"\r\n":
                del self.buf[:2]
            i = self.buf.find(b"\r\n\r\n")
            if i >= 0:
                head = bytes(self.buf[:i])
                del self.buf[: i + 4]
                return head
            if len(self.buf) > _MAX_HEAD:
                raise ConnectionError("request head too large")
            data = await self.reader.read(65536)
            if not data:
                if self.buf:
                    raise ConnectionError("connection closed inside a request head")
                return None
            self.buf += data

    async def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            data = await self.reader.read(max(65536, n - len(self.buf)))
            if not data:
                raise asyncio.IncompleteReadError(bytes(self.buf), n)
            self.buf += data
        body = bytes(self.buf[:n])
        del self.buf[:n]
        return body

    async def watch_eof(self) -> None:
        """Return when the peer closes or resets the connection; keep what it sends."""
        try:
            while data := await self.reader.read(65536):
                self.buf += data
        except ConnectionError:
            pass


def _parse_head(head: bytes) -> tuple[str, str, bool, dict[str, str], int]:
    lines = head.decode("latin-1").split("\r\n")
    method, target, version = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"malformed header line {line!r}")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise ValueError("chunked request bodies are not supported; send Content-Length")
    connection = headers.get("connection", "").lower()
    keep_alive = version == "HTTP/1.1" and connection != "close"
    return method, target, keep_alive, headers, int(headers.get("content-length") or 0)


def _respond(writer: asyncio.StreamWriter, err: HttpError, keep_alive: bool) -> None:
    if isinstance(err.body, str):
        body, ctype = err.body.encode(), "text/plain; charset=utf-8"
    else:
        body, ctype = json.dumps(err.body).encode(), "application/json"
    ctype = err.content_type or ctype
    try:
        phrase = HTTPStatus(err.status).phrase
    except ValueError:
        phrase = "Unknown"
    head = [f"HTTP/1.1 {err.status} {phrase}", f"Content-Type: {ctype}"]
    head.append(f"Content-Length: {len(body)}")
    head += [f"{k}: {v}" for k, v in (err.headers or {}).items()]
    if not keep_alive:
        head.append("Connection: close")
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)


async def _aiter(script: Script) -> AsyncGenerator[ScriptItem, None]:
    if isinstance(script, AsyncIterable):
        async for item in script:
            yield item
    else:
        it: Iterator[ScriptItem] = iter(script)
        for item in it:
            yield item


async def _send(
    writer: asyncio.StreamWriter, item: ScriptItem, items: AsyncIterator[ScriptItem]
) -> None:
    """Write the script, item by item, then the end of the chunked body."""
    while item is not _END:
        payload: bytes | None = None
        if isinstance(item, dict):
            payload = b"data: " + json.dumps(item, ensure_ascii=False).encode() + b"\n\n"
        elif isinstance(item, bytes):
            payload = item
        elif isinstance(item, Pause):
            await asyncio.sleep(item.seconds)
        elif isinstance(item, Gate):
            await item.event.wait()
        elif item is DONE:
            payload = b"data: [DONE]\n\n"
        elif item is CLOSE:
            raise _Closed
        else:
            raise TypeError(f"not a script item here: {item!r} (HttpError must be alone)")
        if payload:
            writer.write(b"%x\r\n%b\r\n" % (len(payload), payload))
            await writer.drain()
        item = await anext(items, _END)
    writer.write(b"0\r\n\r\n")
    await writer.drain()


# -- chunk builders (OpenAI `chat.completion.chunk` shapes) -------------------------------


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-loopback",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": "loopback",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def _err(message: str, code: str = "server_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": code, "code": code}}


def content(text: str) -> dict[str, Any]:
    return _chunk({"content": text})


def reasoning(text: str) -> dict[str, Any]:
    return _chunk({"reasoning_content": text})


def tool_call_part(
    index: int, id: str | None = None, name: str | None = None, arguments: str = ""
) -> dict[str, Any]:
    """One entry of `delta.tool_calls` (for `tool_calls(...)` with several calls)."""
    part: dict[str, Any] = {"index": index}
    if id is not None:
        part["id"] = id
        part["type"] = "function"
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    part["function"] = function
    return part


def tool_call(
    index: int, id: str | None = None, name: str | None = None, arguments: str = ""
) -> dict[str, Any]:
    return _chunk({"tool_calls": [tool_call_part(index, id, name, arguments)]})


def tool_calls(*parts: dict[str, Any]) -> dict[str, Any]:
    """One chunk carrying several tool-call fragments (parallel calls)."""
    return _chunk({"tool_calls": list(parts)})


def finish(reason: str) -> dict[str, Any]:
    return _chunk({}, reason)


def usage(prompt: int, completion: int, reasoning_tokens: int = 0) -> dict[str, Any]:
    chunk = _chunk({})
    chunk["choices"] = []
    chunk["usage"] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    return chunk


def error_chunk(message: str, code: str = "server_error") -> dict[str, Any]:
    return _err(message, code)
