"""A streaming client for OpenAI-compatible chat completions (the ModelClient port).

One pooled `httpx.AsyncClient` per provider. Each `stream()` call runs its HTTP
exchange in one private "pump" task that opens the response, reads the body and
closes the response exactly once; the `async with` block cancels that task at
most once when it ends (normally, by error or by cancellation), so a consumer
cancelled twice cannot leak a pooled connection (encode/httpx#3782). Failures
before the first body byte (connect errors, time-outs, 429/5xx) are retried with
exponential back-off; nothing is retried after it, so no text is ever duplicated.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from service.config import ProviderSettings
from service.core.errors import ProviderError, ProviderTimeout
from service.core.model import ModelDelta, ModelRequest, ToolCallDelta, Usage
from service.providers.interaction_log import CallLog, InteractionLog
from service.providers.sse import SSEParser

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
_MAX_ERROR_BODY = 64 * 1024
_RETRYABLE_ERRORS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)
_DRAIN_S = 0.1  # after [DONE], wait this long for the end of the body, to reuse the connection
_MAX_BUFFERED = 64  # chunks read ahead of the consumer before the pump pauses
_closing: set[asyncio.Task[None]] = set()  # response closes that outlived a cancellation
_Opened = tuple[httpx.Response, AsyncIterator[bytes], bytes]


class OpenAIChatClient:
    """`ModelClient` for one OpenAI-compatible provider (`key` names it in every error)."""

    def __init__(
        self,
        key: str,
        settings: ProviderSettings,
        *,
        log_enabled: bool = True,
        log_mask: bool = True,
        max_retry_delay_s: float = 30.0,
    ) -> None:
        self.key = key
        self.settings = settings
        self.url = settings.base_url.rstrip("/") + "/chat/completions"
        self._max_delay = max_retry_delay_s
        headers = {"Accept": "text/event-stream", "Content-Type": "application/json"}
        api_key = settings.api_key.get_secret_value()
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        headers.update(settings.headers)
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(
                connect=settings.connect_timeout_s,
                read=settings.read_timeout_s,
                write=settings.read_timeout_s,
                pool=settings.read_timeout_s,
            ),
            limits=httpx.Limits(
                max_connections=settings.max_connections,
                max_keepalive_connections=settings.max_connections,
            ),
        )
        self._log = InteractionLog(key, enabled=log_enabled, mask_sensitive=log_mask)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()

    def build_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent upstream for `request`."""
        body: dict[str, Any] = {
            "model": request.model,
            "messages": request.messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = request.tools
            if request.tool_choice is not None:
                body["tool_choice"] = request.tool_choice
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.top_p is not None:
            body["top_p"] = request.top_p
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        on = request.reasoning.enabled
        style = self.settings.reasoning_style
        if style == "reasoning_effort":
            if on:
                body["reasoning_effort"] = request.reasoning.effort.lower()
        elif style == "enable_thinking":
            body["enable_thinking"] = on
        elif style == "chat_template_kwargs":
            body["chat_template_kwargs"] = {"enable_thinking": on}
        elif style == "think":
            body["think"] = on
        _merge(body, self.settings.extra_body)
        return body

    @asynccontextmanager
    async def stream(self, request: ModelRequest) -> AsyncIterator[AsyncIterator[ModelDelta]]:
        """Open the call (retrying before the first byte); yield an iterator of deltas."""
        body = self.build_body(request)
        log = self._log.begin(request, self.url, self._client.headers, body)
        content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        pipe = _Pipe()
        pump = asyncio.create_task(self._pump(content, log, pipe))
        deltas: AsyncGenerator[ModelDelta, None] | None = None
        try:
            first = await pipe.get()
            if first is None:  # cannot happen: _open returns a non-empty first read
                raise ProviderError(self.key, "stream ended before completion")
            deltas = self._deltas(pipe, first, log)
            yield deltas
        except BaseException as exc:
            if log is not None:
                log.end(exc)
            raise
        else:
            if log is not None:
                log.end()
        finally:
            try:
                if deltas is not None:
                    await deltas.aclose()
                if pipe.done_seen and not pump.done():  # let it read the end of the body
                    await asyncio.wait((pump,), timeout=_DRAIN_S)
            finally:
                if not pump.done():
                    pump.cancel()
                    await asyncio.wait((pump,))

    async def _pump(self, content: bytes, log: CallLog | None, pipe: _Pipe) -> None:
        """Own the HTTP exchange: open it, read the body into `pipe`, close the response."""
        response: httpx.Response | None = None
        try:
            response, chunks, first = await self._open(content, log)
            pipe.put(first)
            while True:
                if pipe.full():
                    await pipe.space()
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    pipe.end()
                    return
                pipe.put(chunk)
        except Exception as exc:  # delivered to the consumer
            pipe.end(exc)
        finally:
            if response is not None and not response.is_closed:
                await _close(response)

    async def _open(
        self, content: bytes, log: CallLog | None
    ) -> tuple[httpx.Response, AsyncIterator[bytes], bytes]:
        attempt = 0
        while True:
            retry_after: float | None = None
            try:
                err, retry_after, opened = await self._attempt(content)
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                err = self._transport_error(exc, "request failed")
                err.retryable = isinstance(exc, _RETRYABLE_ERRORS)
            else:
                if opened is not None:
                    return opened
            assert err is not None
            if not err.retryable or attempt >= self.settings.max_retries:
                raise err
            delay = self.settings.retry_backoff_s * (2**attempt)
            if retry_after is not None:
                delay = retry_after
            delay = min(delay, self._max_delay)
            attempt += 1
            if log is not None:
                log.retry(attempt, delay, err)
            await asyncio.sleep(delay)

    async def _attempt(
        self, content: bytes
    ) -> tuple[ProviderError | None, float | None, _Opened | None]:
        """One try: (error, retry_after, None) or (None, None, (response, chunks, first bytes))."""
        request = self._client.build_request("POST", self.url, content=content)
        response = await self._client.send(request, stream=True)
        opened = False
        try:
            status = response.status_code
            if status >= 400:
                msg = f"HTTP {status}: {_error_message(await _read_bounded(response))}"
                err = ProviderError(
                    self.key, msg, status=status, retryable=status in RETRYABLE_STATUS
                )
                return err, _retry_after(response.headers.get("retry-after")), None
            chunks = response.aiter_bytes()
            try:
                first = await anext(chunks)
            except StopAsyncIteration:
                err = ProviderError(self.key, "stream ended before completion", retryable=True)
                return err, None, None
            opened = True
            return None, None, (response, chunks, first)
        finally:
            if not opened:
                await _close(response)

    async def _deltas(
        self, pipe: _Pipe, first: bytes, log: CallLog | None
    ) -> AsyncGenerator[ModelDelta, None]:
        parser = SSEParser()
        parse = self.parse_chunk
        finished = eof = False
        error: ProviderError | None = None
        pending = parser.feed(first)
        while True:
            for data in pending:
                if data == "[DONE]":
                    pipe.done_seen = True
                    return
                delta = parse(data)
                if delta is None:
                    continue
                if delta.finish_reason is not None:
                    finished = True
                if log is not None:
                    log.delta(delta)
                yield delta
            if eof:
                if finished:
                    return
                raise error or ProviderError(self.key, "stream ended before completion")
            try:
                chunk = await pipe.get()
            except httpx.TimeoutException as exc:
                raise ProviderTimeout(
                    self.key, f"no data within the read time-out of {self.settings.read_timeout_s}s"
                ) from exc
            except httpx.HTTPError as exc:
                pending, eof = [], True
                error = self._transport_error(exc, "stream ended before completion")
            else:
                if chunk is not None:
                    pending = parser.feed(chunk)
                else:
                    pending, eof = parser.flush(), True

    def parse_chunk(self, data: str) -> ModelDelta | None:
        """One SSE data payload → one ModelDelta, or None when the chunk carries nothing."""
        try:
            obj = json.loads(data)
        except ValueError:
            raise ProviderError(self.key, f"invalid JSON in stream: {data[:200]!r}") from None
        if not isinstance(obj, dict):
            raise ProviderError(self.key, f"unexpected stream payload: {data[:200]!r}")
        if obj.get("error"):
            err = obj["error"]
            msg = _message_of(obj) or str(err)[:500]
            code = err.get("code") if isinstance(err, dict) else None
            status = code if isinstance(code, int) else None
            raise ProviderError(
                self.key, f"stream error: {msg}", status=status, reason="PROVIDER_STREAM_ERROR"
            )
        usage = _usage(obj.get("usage"))
        choices = obj.get("choices")
        if not choices:
            return None if usage is None else ModelDelta(usage=usage)
        choice = choices[0]
        delta = choice.get("delta") or {}
        content = delta.get("content") or None
        reasoning = delta.get("reasoning_content") or delta.get("reasoning") or None
        if reasoning is not None and not isinstance(reasoning, str):
            reasoning = None
        finish = choice.get("finish_reason") or None
        tool_calls: tuple[ToolCallDelta, ...] = ()
        raw_calls = delta.get("tool_calls")
        if raw_calls:
            tool_calls = tuple(_tool_calls(raw_calls))
        if content is None and reasoning is None and not tool_calls and finish is None:
            return None if usage is None else ModelDelta(usage=usage)
        return ModelDelta(reasoning, content, tool_calls, finish, usage)

    def _transport_error(self, exc: Exception, what: str) -> ProviderError:
        detail = f"{what}: {type(exc).__name__}: {exc}".rstrip(": ")
        if isinstance(exc, httpx.TimeoutException):
            return ProviderTimeout(self.key, detail)
        return ProviderError(self.key, detail)


def _tool_calls(raw: list[dict[str, Any]]) -> list[ToolCallDelta]:
    out: list[ToolCallDelta] = []
    for pos, call in enumerate(raw):
        fn = call.get("function") or {}
        index = call.get("index")
        tc = ToolCallDelta(
            index=index if isinstance(index, int) else pos,
            id=call.get("id") or None,
            name=fn.get("name") or None,
            arguments=fn.get("arguments") or "",
        )
        if tc.id or tc.name or tc.arguments:
            out.append(tc)
    return out


def _usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    details = raw.get("completion_tokens_details") or {}
    prompt_details = raw.get("prompt_tokens_details") or {}
    prompt = raw.get("prompt_tokens") or 0
    completion = raw.get("completion_tokens") or 0
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=raw.get("total_tokens") or prompt + completion,
        reasoning_tokens=details.get("reasoning_tokens") or 0,
        cached_tokens=prompt_details.get("cached_tokens") or 0,
    )


def _message_of(obj: Any) -> str:
    """`error.message` (or `message`/`msg`/`detail`, or a string `error`) of a JSON error."""
    if not isinstance(obj, dict):
        return ""
    err = obj.get("error", obj)
    if isinstance(err, str):
        return err[:500]
    if isinstance(err, dict):
        for k in ("message", "msg", "detail"):
            if isinstance(err.get(k), str) and err[k]:
                return str(err[k])[:500]
    return ""


def _error_message(raw: bytes) -> str:
    """The provider's message from an error body: `error.message`, else the text, truncated."""
    text = raw.decode("utf-8", "replace").strip()
    try:
        msg = _message_of(json.loads(text))
    except ValueError:
        msg = ""
    if msg:
        return msg
    return (text[:500] + "…") if len(text) > 500 else (text or "(empty body)")


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


async def _read_bounded(response: httpx.Response) -> bytes:
    buf = bytearray()
    async for chunk in response.aiter_bytes():
        buf += chunk
        if len(buf) >= _MAX_ERROR_BODY:
            break
    return bytes(buf)


async def _close(response: httpx.Response) -> None:
    """Close the response; a cancellation cannot interrupt the close half-way."""
    task = asyncio.ensure_future(response.aclose())
    _closing.add(task)
    task.add_done_callback(_closing.discard)
    await asyncio.shield(task)


class _Pipe:
    """Chunks from the pump task to the consumer, with back-pressure; None marks the end."""

    __slots__ = ("_buf", "_end", "_error", "_space", "_waiter", "done_seen")

    def __init__(self) -> None:
        self._buf: deque[bytes] = deque()
        self._end = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._space: asyncio.Future[None] | None = None
        self.done_seen = False  # the consumer saw [DONE]

    def put(self, chunk: bytes) -> None:
        self._buf.append(chunk)
        self._wake()

    def end(self, error: BaseException | None = None) -> None:
        self._end = True
        self._error = error
        self._wake()

    def full(self) -> bool:
        return len(self._buf) >= _MAX_BUFFERED

    async def space(self) -> None:
        self._space = asyncio.get_running_loop().create_future()
        await self._space

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> bytes | None:
        """The next chunk; None at the end; raises what ended the exchange."""
        while not self._buf:
            if self._end:
                if self._error is not None:
                    raise self._error
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        chunk = self._buf.popleft()
        space = self._space
        if space is not None and not space.done():
            self._space = None
            space.set_result(None)
        return chunk


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            into[k] = dict(into[k])
            _merge(into[k], v)
        else:
            into[k] = v
