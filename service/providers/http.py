"""A streaming HTTP client of a model API (the ModelClient port), whatever its wire format.

`StreamingClient` does the HTTP of every provider the same way; a `Wire` says
what differs between APIs: the URL of a call, the authentication headers, the
request body built from the port's `ModelRequest`, the event that ends a
stream, and a decoder, made per stream, turning each event's data into one
`ModelDelta` (`service.providers.openai_wire`, `anthropic_wire`, `gemini_wire`).

One pooled `aiohttp.ClientSession` per client, created in the running loop on
first use. The consuming task reads the body itself (`readany`, then the SSE
parser) and gets one `ModelDelta` per upstream event: no helper task, no queue.

Leaving the `async with` block (normally, by error or by cancellation) closes
the response exactly once, synchronously: aiohttp's `ClientResponse.close()`
does not await, so a second cancellation cannot interrupt it half-way. A body
read to its end has already given its connection back to the pool (aiohttp
does that at end of body); any other connection is closed, which the provider
see it at once. At most `max_connections` calls are open at once (a semaphore,
see `_take_slot`). Failures before the first body byte (connect errors,
time-outs, 429/5xx) are retried with exponential back-off, or after the
provider's `Retry-After`; nothing is retried after it, so no text is ever
duplicated. A `Retry-After` longer than `max_retry_after_s` fails the call at
once, naming it: waiting it out would hold the run for longer than the user
agreed to, and retrying earlier would be refused again. An error status is
raised as a `RefusedCall`, which keeps the `Retry-After` and the provider's
error code for whoever routes calls (service/providers/routing/).

The read time-out (`read_timeout_s`) bounds every wait for the provider: for
the response head and its first bytes it is aiohttp's `sock_read`; for the
rest of the body, a read that waits that long with no data fails the call with
a `ProviderTimeout`. That second part is one watchdog per stream (`_ReadWatch`)
rather than aiohttp's timer, which is cancelled and re-armed on every chunk
received: the body's reads only note when they start waiting.

A successful answer whose body is not an event stream (an HTML page from a
proxy or a wrong base URL, a JSON completion from a server that ignored
`stream`) fails the call with its content type and the start of its body; a
body that ends inside an event fails it as a stream cut mid-event.

The body is parsed with bounded lines and events (`max_sse_line_bytes`,
`max_sse_event_bytes`): a provider that breaks a bound fails the call with a
`ProviderError` naming it. Every secret the client knows (the API key, the
values of secret-looking or `secret_headers` headers, credentials in the base
URL or `extra_body`, proxy credentials) is masked by value in every error
message it produces, before any truncation.

Each request sent (with those secrets, for masking) and each retry are reported
to the call's observer (`service.providers.observer`): the interaction log
(`LoggedModel`, which wraps the client when it is on) makes its lines of them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Protocol

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from pydantic import SecretStr
from yarl import URL

from service.core.errors import ProviderError, ProviderStreamError, ProviderTimeout
from service.core.masking import SecretMask, is_secret_header, is_sensitive
from service.core.model import ModelDelta, ModelRequest
from service.core.timers import Timer, shared_timer
from service.providers import observer
from service.providers.openai_wire import (
    ReasoningStyle,
    encode_body,
    error_code,
    error_message,
    retry_after,
)
from service.providers.sse import (
    DEFAULT_MAX_EVENT_BYTES,
    DEFAULT_MAX_LINE_BYTES,
    SSELimitExceeded,
    SSEParser,
)

RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
_MAX_ERROR_BODY = 64 * 1024
# TimeoutError covers aiohttp's connect and socket-read time-outs.
_RETRYABLE_ERRORS = (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)
_DRAIN_S = (
    0.1  # after the end event, wait this long for the end of the body, to reuse the connection
)
_SHOWN_BODY = 120  # bytes of a body that is not an event stream quoted in the error
_SSE_FIELDS = (b"data:", b"event:", b"id:", b"retry:", b":")


ApiName = Literal["openai", "anthropic", "gemini"]
"""The wire format a provider speaks: OpenAI chat completions (and compatible servers),
Anthropic's Messages API, Google's Gemini API."""


@dataclass(frozen=True)
class ProviderOptions:
    """What the client of one provider reads; `service.assembly.app` builds it."""

    base_url: str  # up to the API version, e.g. https://api.openai.com/v1
    api_key: SecretStr = field(default_factory=lambda: SecretStr(""))
    default_model: str = ""
    api: ApiName = "openai"
    reasoning_style: ReasoningStyle = "reasoning_effort"  # OpenAI-compatible APIs only
    # The answer's length when a request sets none, for APIs that need one (Anthropic).
    max_tokens: int = 8192
    # Merged into every body; sent with every request (may hold secrets: not in the repr).
    extra_body: Mapping[str, Any] = field(default_factory=dict, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    # Names of `headers` whose values are secrets, besides those whose names say so
    # (containing auth, key, token, secret, password, credential or cookie).
    secret_headers: tuple[str, ...] = ()
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0
    max_retries: int = 2
    retry_backoff_s: float = 0.5
    # The longest wait before a retry, asked by the provider (`Retry-After`) or by the
    # back-off; a longer `Retry-After` fails the call at once.
    max_retry_after_s: float = 30.0
    max_connections: int = 200
    max_sse_line_bytes: int = DEFAULT_MAX_LINE_BYTES  # longest line of the event stream
    max_sse_event_bytes: int = DEFAULT_MAX_EVENT_BYTES  # largest data of one event


#: What a decoder returns for the event that ends a stream (Anthropic's `message_stop`).
END = ModelDelta()

Decoder = Callable[[str], "ModelDelta | None"]
"""One event's data → its delta (`END` at the end of the stream), or None when it carries
nothing; raises `ProviderError` for data it cannot read. Made per stream: it may keep state."""


class Wire(Protocol):
    """What differs between model APIs: everything but the HTTP."""

    #: The data of the event that ends a stream (OpenAI's "[DONE]"), if the API has one.
    done_data: str | None

    def url(self, base_url: str, request: ModelRequest) -> str:
        """Where a call of `request` is posted."""
        ...

    def auth_headers(self, api_key: str) -> dict[str, str]:
        """The headers that carry the API key."""
        ...

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body of a streaming call of `request`."""
        ...

    def decoder(self, provider: str, scrub: Callable[[str], str]) -> Decoder:
        """A decoder of one stream's events; `scrub` masks secrets in quoted provider text."""
        ...


class RefusedCall(ProviderError):
    """The provider answered the call with an error status (its reason: PROVIDER_ERROR).

    Besides the status: the `Retry-After` it asked for, if any, and its error code
    (`error.code`, `error.type` or `error.status` of the body), for whoever routes calls.
    """

    def __init__(
        self,
        provider: str,
        message: str,
        *,
        status: int,
        retryable: bool = False,
        retry_after_s: float | None = None,
        code: str = "",
    ) -> None:
        super().__init__(provider, message, status=status, retryable=retryable)
        self.retry_after_s = retry_after_s
        self.code = code


class StreamingClient:
    """`ModelClient` for one provider speaking `wire` (`key` names it in every error)."""

    def __init__(self, key: str, options: ProviderOptions, wire: Wire) -> None:
        self.key = key
        self.options = options
        self.wire = wire
        self.base_url = options.base_url.rstrip("/")
        headers = {"Accept": "text/event-stream", "Content-Type": "application/json"}
        api_key = options.api_key.get_secret_value()
        if api_key:
            headers.update(wire.auth_headers(api_key))
        headers.update(options.headers)
        self._headers = headers
        self._proxy: URL | None = None
        self._proxy_auth: aiohttp.BasicAuth | None = None
        with contextlib.suppress(LookupError, ValueError):  # HTTP(S)_PROXY / NO_PROXY, once
            self._proxy, self._proxy_auth = get_env_proxy_for_url(URL(self.base_url))
        self._mask = SecretMask(_known_secrets(options, headers, self._proxy_auth))
        self._session: aiohttp.ClientSession | None = None
        self._slots = asyncio.Semaphore(options.max_connections)

    def _start(self) -> aiohttp.ClientSession:
        """The connection pool, created on first use (aiohttp binds it to the running loop)."""
        s = self.options
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),  # `_slots` is the limit
            headers=self._headers,
            proxy=self._proxy,
            proxy_auth=self._proxy_auth,
            timeout=aiohttp.ClientTimeout(
                total=None,
                connect=s.connect_timeout_s,
                sock_connect=s.connect_timeout_s,
                sock_read=s.read_timeout_s,
            ),
        )
        return self._session

    async def aclose(self) -> None:
        """Close the connection pool."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def build_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent upstream for `request`."""
        return self.wire.body(request)

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelDelta]]:
        """The call of `request`: entered, it is opened (retrying before the first byte) and
        gives an iterator of deltas; left, it is closed."""
        return _Call(self, request)

    def _encoded(self, url: str, request: ModelRequest) -> bytes:
        """The bytes of `request`'s body (which the interaction observer sees first)."""
        body = self.wire.body(request)
        observer.current().request(url, self._headers, body, self._mask)
        return encode_body(body)

    def _scrub(self, error: ProviderError) -> None:
        """Mask this provider's secrets in an error, whatever raised it (they are masked
        where the message is made; this also covers errors made elsewhere)."""
        masked = self._mask(error.message)
        if masked != error.message:
            error.message = masked
            error.args = (masked,)

    async def _take_slot(self) -> None:
        """One of the `max_connections` slots, waiting at most the read time-out for it.

        The limit is an `asyncio.Semaphore` rather than the connector's: a
        connector waiter that is woken and then cancelled before it runs
        swallows the wake-up, and the next waiter sleeps until its connect
        time-out although a connection is free. The semaphore hands the slot on.
        """
        if not self._slots.locked():
            await self._slots.acquire()  # does not suspend
            return
        timeout = self.options.read_timeout_s
        try:
            async with asyncio.timeout(timeout):
                await self._slots.acquire()
        except TimeoutError:
            n = self.options.max_connections
            raise ProviderTimeout(
                self.key, f"no free connection within {timeout}s (max_connections={n})"
            ) from None

    async def _open(self, url: str, content: bytes) -> tuple[aiohttp.ClientResponse, bytes]:
        """The response and its first body bytes, after retries (each reported to the call's
        observer); holds a slot on return."""
        session = self._session or self._start()
        attempt = 0
        while True:
            retry_after_s: float | None = None
            opened: tuple[aiohttp.ClientResponse, bytes] | None = None
            await self._take_slot()
            try:
                err, retry_after_s, opened = await self._attempt(session, url, content)
            except (aiohttp.ClientError, TimeoutError) as exc:
                err = self._transport_error(exc, "request failed")
                err.retryable = isinstance(exc, _RETRYABLE_ERRORS)
            finally:
                if opened is None:  # failed or cancelled: no slot is held across back-off
                    self._slots.release()
            if opened is not None:
                return opened
            assert err is not None
            if not err.retryable or attempt >= self.options.max_retries:
                raise err
            cap = self.options.max_retry_after_s
            if retry_after_s is not None and retry_after_s > cap:
                raise self._retry_after_error(err, retry_after_s)
            delay = self.options.retry_backoff_s * (2**attempt)
            if retry_after_s is not None:
                delay = retry_after_s
            delay = min(delay, cap)
            attempt += 1
            observer.current().retry(attempt, delay, err)
            await asyncio.sleep(delay)

    async def _attempt(
        self, session: aiohttp.ClientSession, url: str, content: bytes
    ) -> tuple[ProviderError | None, float | None, tuple[aiohttp.ClientResponse, bytes] | None]:
        """One try: (error, retry_after, None) or (None, None, (response, first bytes))."""
        response = await session.post(url, data=content)
        opened = False
        try:
            status = response.status
            if status >= 400:
                raw = await _read_bounded(response.content)
                wait = retry_after(response.headers.get("Retry-After"))
                refused = RefusedCall(
                    self.key,
                    f"HTTP {status}: {error_message(raw, self._mask)}",
                    status=status,
                    retryable=status in RETRYABLE_STATUS,
                    retry_after_s=wait,
                    code=error_code(raw),
                )
                return refused, wait, None
            try:
                first = await response.content.readany()
            except (aiohttp.ClientError, TimeoutError):
                first = _unread(response.content)
                if not first:
                    raise
            if not first:
                err = ProviderError(self.key, "stream ended before completion", retryable=True)
                return err, None, None
            content_type = response.headers.get("Content-Type", "")
            if not _is_event_stream(content_type, first):
                return self._not_an_event_stream(content_type, first), None, None
            opened = True
            return None, None, (response, first)
        finally:
            if not opened:
                response.close()

    async def _deltas(
        self, response: aiohttp.ClientResponse, chunk: bytes
    ) -> AsyncGenerator[ModelDelta, None]:
        """The deltas of the body, read by the consuming task; `chunk` is its first bytes."""
        options = self.options
        body = response.content
        watch = _ReadWatch(response, options.read_timeout_s)
        reading = watch.reading
        parser = SSEParser(options.max_sse_line_bytes, options.max_sse_event_bytes)
        feed = parser.feed
        decode = self.wire.decoder(self.key, self._mask)
        done = self.wire.done_data
        finished = False
        error: ProviderError | None = None
        lost = ""  # how the connection was lost, if it was
        try:
            while True:
                if not chunk:  # end of body without its end event: what it left unterminated
                    for data in parser.flush():
                        if data == done:
                            return
                        delta = self._last_event(decode, data, lost)
                        if delta is None:
                            continue
                        if delta is END:
                            return
                        if delta.finish_reason is not None:
                            finished = True
                        yield delta
                    if finished:
                        return
                    raise error or ProviderError(self.key, "stream ended before completion")
                for data in feed(chunk):
                    if data == done:
                        await _drain(body)
                        return
                    delta = decode(data)
                    if delta is None:
                        continue
                    if delta is END:
                        await _drain(body)
                        return
                    if delta.finish_reason is not None:
                        finished = True
                    yield delta
                if parser.error is not None:  # after the events completed before the breach
                    raise self._limit_error(parser.error)
                # Nothing read is held while the next read waits (the stream may be silent
                # for long): not the chunk, not its last event's text, not its delta.
                chunk, data, delta = b"", "", None
                try:
                    reading()
                    chunk = await body.readany()
                    watch.since = 0.0
                except (aiohttp.ClientError, TimeoutError) as exc:
                    chunk = _unread(body)
                    if chunk:
                        continue  # the same error comes again on the next read
                    if isinstance(exc, TimeoutError):
                        timeout = options.read_timeout_s
                        raise ProviderTimeout(
                            self.key, f"no data within the read time-out of {timeout}s"
                        ) from exc
                    error = self._transport_error(exc, "stream ended before completion")
                    lost = self._mask(f"{type(exc).__name__}: {exc}".rstrip(": "))
        finally:
            watch.close()

    def _last_event(self, decode: Decoder, data: str, lost: str) -> ModelDelta | None:
        """The delta of an event the body ended without terminating (some servers omit the
        last blank line); one that does not decode was cut mid-event (`lost`: how the
        connection was lost, "" for a body that ended cleanly)."""
        try:
            return decode(data)
        except ProviderStreamError:
            raise
        except ProviderError:
            size = len(data.encode())
            how = f" ({lost})" if lost else ""
            raise ProviderError(
                self.key,
                f"stream cut mid-event before completion: the body ended{how} inside an "
                f"event, after {size} bytes of it",
            ) from None

    def _retry_after_error(self, refused: ProviderError, retry_after_s: float) -> RefusedCall:
        """The call's refusal when its `Retry-After` is beyond the retry cap: not retried."""
        what = "rate-limited the call" if refused.status == 429 else "refused the call"
        detail = refused.message.partition(": ")[2]
        cap = self.options.max_retry_after_s
        return RefusedCall(
            self.key,
            f"{what} ({detail}): Retry-After {retry_after_s:g} s exceeds the retry cap of "
            f"{cap:g} s (the provider's max_retry_after_s setting)",
            status=refused.status or 0,
            retry_after_s=retry_after_s,
            code=refused.code if isinstance(refused, RefusedCall) else "",
        )

    def _not_an_event_stream(self, content_type: str, first: bytes) -> ProviderError:
        """A successful answer whose body is not an event stream (not retried)."""
        shown = " ".join(first[:_SHOWN_BODY].decode("utf-8", "replace").split())
        shown = self._mask(shown)
        more = "…" if len(first) > _SHOWN_BODY else ""
        return ProviderError(
            self.key,
            f"the answer is not an event stream: HTTP 200 with Content-Type "
            f"{content_type or '(none)'!r}, body starting {shown + more!r}",
            status=200,
        )

    def _limit_error(self, exc: SSELimitExceeded) -> ProviderError:
        setting = f"max_sse_{exc.limit}_bytes"
        return ProviderError(self.key, f"stream rejected: {exc} (the provider's {setting} setting)")

    def _transport_error(self, exc: Exception, what: str) -> ProviderError:
        detail = self._mask(f"{what}: {type(exc).__name__}: {exc}".rstrip(": "))
        if isinstance(exc, TimeoutError):
            return ProviderTimeout(self.key, detail)
        return ProviderError(self.key, detail)


class _Call(AbstractAsyncContextManager[AsyncIterator[ModelDelta]]):
    """One call of a `StreamingClient` (its `stream`): a slotted object rather than a
    generator-based context manager, whose generator, its frame and its registration with
    the loop would be held for as long as the answer streams. Every `ProviderError` it
    lets through, raised opening the call or reading its deltas, is scrubbed of the
    client's secrets."""

    __slots__ = ("_client", "_deltas", "_request", "_response")

    def __init__(self, client: StreamingClient, request: ModelRequest) -> None:
        self._client = client
        self._request: ModelRequest | None = request
        self._response: aiohttp.ClientResponse | None = None
        self._deltas: AsyncGenerator[ModelDelta, None] | None = None

    async def __aenter__(self) -> AsyncIterator[ModelDelta]:
        client, request = self._client, self._request
        assert request is not None, "a call is entered once"
        self._request = None  # the request is not held while the answer streams
        url = client.wire.url(client.base_url, request)
        try:
            # Nor is its body: only its bytes, while they are sent.
            body = client._encoded(url, request)
            del request
            response, first = await client._open(url, body)  # holds a slot
        except ProviderError as exc:
            client._scrub(exc)
            raise
        self._response = response
        deltas = self._deltas = client._deltas(response, first)
        return deltas

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        client, response, deltas = self._client, self._response, self._deltas
        self._response = self._deltas = None
        try:
            if response is not None and deltas is not None:
                # synchronous up to `aclose`, which does not suspend either
                response.close()  # a body read to its end is back in the pool already
                client._slots.release()
                await deltas.aclose()
        except ProviderError as error:
            client._scrub(error)
            raise
        if isinstance(exc, ProviderError):
            client._scrub(exc)


class _ReadWatch:
    """The read time-out of one response body: one timer per stream, not one per read.

    aiohttp's `sock_read` cancels and re-arms a timer on every chunk received;
    here a read only notes when it starts waiting (`reading`: a clock reading
    and the body's byte count; `since` goes back to 0 when the read returns)
    and one timer, armed by the first read, checks when the oldest possible
    deadline comes: if that read was answered, it stops until the next read
    re-arms it; if a later read is waiting, it waits for that read's deadline;
    if the read has waited `timeout` seconds with no byte received, the body
    fails with aiohttp's socket time-out error — as the body of a `sock_read`
    time-out does. The one difference with `sock_read`: time the consumer
    spends away from the body (writing what it read to a slow client) is not
    counted against the provider.

    aiohttp's own timer keeps bounding the wait for the response head and its
    first bytes; it is switched off for the rest of the body here. The timer is a
    deadline on the loop's shared timer (service/core/timers.py).
    """

    __slots__ = ("_body", "_handle", "_loop", "_timeout", "received", "since")

    def __init__(self, response: aiohttp.ClientResponse, timeout: float) -> None:
        self._body = response.content
        self._loop = asyncio.get_running_loop()
        self._timeout = timeout
        self._handle: Timer | None = None
        self.since = 0.0  # when the latest read started waiting
        self.received = 0  # the body's byte count then
        connection = response.connection  # None once the whole body was received
        if connection is not None and connection.protocol is not None:
            connection.protocol.read_timeout = None
            connection.protocol.start_timeout()  # drops the timer armed by the last chunk

    def reading(self) -> None:
        """A read of the body is about to wait for data."""
        self.since = now = self._loop.time()
        self.received = self._body.total_bytes
        if self._handle is None and self._timeout:
            self._handle = shared_timer().call_at(now + self._timeout, self._check)

    def _check(self) -> None:
        self._handle = None
        if not self.since or self._body.total_bytes != self.received:
            return  # the read was answered (its task may not have run yet): the next one re-arms
        due = self.since + self._timeout
        if self._loop.time() < due:  # a later read is waiting: check at its deadline
            self._handle = shared_timer().call_at(due, self._check)
            return
        self._body.set_exception(aiohttp.SocketTimeoutError("Timeout on reading data from socket"))

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def _known_secrets(
    options: ProviderOptions, headers: Mapping[str, str], proxy_auth: aiohttp.BasicAuth | None
) -> list[str]:
    """Every secret value the client of `options` sends or holds, to be masked by value."""
    secrets = [options.api_key.get_secret_value()]
    explicit = {name.lower() for name in options.secret_headers}
    for name, value in headers.items():
        if is_secret_header(name) or name.lower() in explicit:
            secrets.append(value)
            scheme, _, credentials = value.partition(" ")  # "Bearer <token>"
            if credentials and scheme.isalpha():
                secrets.append(credentials.strip())
    url = URL(options.base_url)
    if url.password:
        secrets.append(url.password)
    secrets += [v for k, v in url.query.items() if is_sensitive(k) or is_secret_header(k)]
    if proxy_auth is not None and proxy_auth.password:
        secrets.append(proxy_auth.password)
    secrets += _sensitive_values(options.extra_body)
    return secrets


def _sensitive_values(value: Any) -> list[str]:
    """The string values under sensitive keys (api_key, token, ...) of a JSON value, any depth."""
    if isinstance(value, Mapping):
        out: list[str] = []
        for k, v in value.items():
            if is_sensitive(str(k)) and isinstance(v, str):
                out.append(v)
            else:
                out += _sensitive_values(v)
        return out
    if isinstance(value, list | tuple):
        return [s for v in value for s in _sensitive_values(v)]
    return []


def _is_event_stream(content_type: str, first: bytes) -> bool:
    """Whether a successful answer is an event stream: so labelled, or (a mislabelled one)
    its first bytes begin with an SSE field."""
    if content_type.partition(";")[0].strip().lower() == "text/event-stream":
        return True
    head = first.removeprefix(b"\xef\xbb\xbf").lstrip(b"\r\n")[:6]
    return any(field.startswith(head) or head.startswith(field) for field in _SSE_FIELDS)


async def _read_bounded(body: aiohttp.StreamReader) -> bytes:
    buf = bytearray()
    while len(buf) < _MAX_ERROR_BODY:
        chunk = await body.readany()
        if not chunk:
            break
        buf += chunk
    return bytes(buf[:_MAX_ERROR_BODY])


def _unread(body: aiohttp.StreamReader) -> bytes:
    """What the body received before its connection failed, which `readany` no longer returns.

    aiohttp's `StreamReader.readany` raises a failure (connection lost, read
    time-out) as soon as it is recorded, ahead of the bytes still buffered: the
    end of an answer, often its finish_reason, when the consumer was busy as the
    provider cut the connection. They are taken here (aiohttp has no public call
    for it), so every byte received is delivered before the failure.
    """
    if not body._buffer:
        return b""
    return body._read_nowait(-1)


async def _drain(body: aiohttp.StreamReader) -> None:
    """After [DONE]: read the end of the body (briefly) so its connection goes back to the pool."""
    if body.is_eof():
        return
    try:
        async with asyncio.timeout(_DRAIN_S):
            while await body.readany():
                pass
    except (TimeoutError, aiohttp.ClientError):
        pass  # the connection is closed instead of reused
