"""The door of every gateway RPC: admission, authentication, undecodable requests.

`GatewayGuard` is a grpc.aio server interceptor. For each call to the
`agw.v1.AgentGateway` service it
- decodes the request itself, so that bytes that are not the request message
  end the call with INVALID_ARGUMENT and one log line (not UNKNOWN and a
  traceback);
- authenticates the caller (`service.transport.auth`) and ends the call with
  UNAUTHENTICATED when the credentials do not fit;
- makes the caller's principal available to the handler (`principal()`);
- logs one INFO line per call when it ends: the method, the peer, the status
  code, the duration and, for streams, the number of events sent. Nothing the
  caller sent (messages, credentials) is in it. A call over a unix socket (the
  HTTP adapter of a worker, `AGW_WORKERS`, calls its own service so) is logged
  with the HTTP client's address the adapter passes in `x-forwarded-for`
  instead of the socket's empty peer; over TCP the peer is always the
  connection's, whatever the metadata says.

Health and reflection calls are not authenticated; their requests are decoded
safely too (`_decoded_safely`).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from service.core.errors import AgwError, InvalidRequest
from service.core.ids import ANONYMOUS, Principal
from service.transport.auth import Authenticator
from service.transport.errors import abort

log = logging.getLogger("agw.grpc")

SERVICE_PREFIX = "/agw.v1.AgentGateway/"
#: The metadata key in which the HTTP adapter passes its client's address.
FORWARDED_FOR = "x-forwarded-for"


class _Call:
    """The call being handled: its caller (anonymous until authenticated) and the number
    of messages it has sent so far. One context variable for both: each one set is a
    node of the call's context, kept for as long as the call (and its run) lasts."""

    __slots__ = ("count", "principal")

    def __init__(self) -> None:
        self.principal = ANONYMOUS
        self.count = 0


# The call's own: the response serializer runs in the call's own task (inside
# `context.write` for streams), so it finds the counter its call set.
_call: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("agw_call", default=None)


def principal() -> Principal:
    """The principal of the call being handled."""
    call = _call.get()
    return call.principal if call is not None else ANONYMOUS


class Undecodable:
    """Stands for a request whose bytes are not the method's request message."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


def _safe(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def decode(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as error:
            return Undecodable(f"{type(error).__name__}: {error}")

    return decode


def _counting(serializer: Callable[..., bytes] | None) -> Callable[[Any], bytes] | None:
    """`serializer` counting the call's messages. A protobuf message is written in its
    deterministic form (map entries sorted): an event a late reader gets parsed again from
    the bytes its run holds (service/core/run/eventlog.py) is then written as the very
    bytes the live stream got, whatever order its maps' entries were in."""
    if serializer is None:
        return None
    protobuf = getattr(serializer, "__name__", "") == "SerializeToString"

    def encode(message: Any) -> bytes:
        call = _call.get()
        if call is not None:
            call.count += 1
        return serializer(message, deterministic=True) if protobuf else serializer(message)

    return encode


def _final_code(context: grpc.aio.ServicerContext[Any, Any]) -> grpc.StatusCode:
    """The status a call that returned normally ends with."""
    if context.cancelled():
        return grpc.StatusCode.CANCELLED
    code = context.code()
    return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.OK


def _peer(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The caller's address: the HTTP client's for the adapter's calls over a unix socket."""
    peer = context.peer() or ""
    if peer.startswith("unix"):
        for key, value in context.invocation_metadata() or ():
            if key == FORWARDED_FOR and isinstance(value, str):
                return value
    return peer


def _log_call(
    name: str,
    context: grpc.aio.ServicerContext[Any, Any],
    code: grpc.StatusCode,
    started: float,
    sent: int | None,
) -> None:
    duration_ms = round((time.perf_counter() - started) * 1000, 1)
    peer = _peer(context)
    fields: dict[str, Any] = {
        "method": name,
        "peer": peer,
        "status": code.name,
        "duration_ms": duration_ms,
    }
    events = ""
    if sent is not None:
        fields["events"] = sent
        events = f", {sent} events"
    log.info(
        "%s from %s: %s in %.1f ms%s", name, peer, code.name, duration_ms, events, extra=fields
    )


class GatewayGuard(grpc.aio.ServerInterceptor):
    """Decodes safely and authenticates every call of the gateway service."""

    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator
        # The guarded handler of each method, made once: gRPC keeps a call's handler for as
        # long as the call lasts, and an open stream should not hold its own copy of the
        # wrappers (with their closures). Keyed by method, checked against the handler the
        # service returned (the same object for every call of a method).
        self._guarded_handlers: dict[str, tuple[Any, grpc.RpcMethodHandler[Any, Any]]] = {}

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler: Any = await continuation(details)
        method: str = details.method
        if handler is None:
            return None
        cached = self._guarded_handlers.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        guarded = self._guard(handler, method)
        self._guarded_handlers[method] = (handler, guarded)
        return guarded

    def _guard(self, handler: Any, method: str) -> grpc.RpcMethodHandler[Any, Any]:
        if not method.startswith(SERVICE_PREFIX):
            return _decoded_safely(handler, method)
        name = method.removeprefix(SERVICE_PREFIX)
        # The handlers are `grpc.RpcMethodHandler` named tuples: swap two of their fields.
        if handler.unary_unary is not None:
            kind = "unary_unary"
        elif handler.unary_stream is not None:
            kind = "unary_stream"
        else:
            return handler  # type: ignore[no-any-return]
        guarded: grpc.RpcMethodHandler[Any, Any] = handler._replace(
            **{kind: self._guarded(name, getattr(handler, kind), stream=kind == "unary_stream")},
            request_deserializer=_safe(handler.request_deserializer),
            response_serializer=_counting(handler.response_serializer),
        )
        return guarded

    def _guarded(
        self, name: str, behavior: Any, *, stream: bool
    ) -> Callable[[Any, Any], Awaitable[Any]]:

        async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            """Refuse an undecodable or unauthenticated call, else let the handler serve it;
            log the call as it ends. One coroutine: an open stream's frames are its memory."""
            started = time.perf_counter()
            call = _Call()
            _call.set(call)
            code = grpc.StatusCode.UNKNOWN  # an exception other than an abort
            try:
                try:
                    if isinstance(request, Undecodable):
                        log.warning("%s: undecodable request (%s)", name, request.error[:200])
                        raise InvalidRequest(f"the request is not a valid {name} request")
                    who = await self.authenticator.authenticate(_metadata(context))
                except AgwError as error:
                    await abort(context, error)
                    result = None
                else:
                    call.principal = who
                    result = await behavior(request, context)
                code = _final_code(context)
                return result
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                raise
            except grpc.aio.AbortError:
                code = _final_code(context)
                raise
            finally:
                _log_call(name, context, code, started, call.count if stream else None)

        return guarded


def _metadata(context: grpc.aio.ServicerContext[Any, Any]) -> dict[str, str]:
    """The call's text metadata."""
    return {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}


_KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


def _decoded_safely(handler: Any, name: str) -> grpc.RpcMethodHandler[Any, Any]:
    """`handler` (of health or reflection) ending undecodable requests INVALID_ARGUMENT.

    Left to gRPC, a request whose bytes are not the method's message ends UNKNOWN
    with an ERROR and its traceback in the log, for anyone who can reach the port.
    """
    kind = next(k for k in _KINDS if getattr(handler, k) is not None)
    behavior = getattr(handler, kind)
    streamed = kind.startswith("stream")

    async def vetted(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if isinstance(request, Undecodable):
            log.warning("%s: undecodable request (%s)", name, request.error[:200])
            await abort(context, InvalidRequest(f"the request is not a valid {name} request"))
        return request

    async def each_vetted(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        async for request in requests:
            yield await vetted(request, context)

    async def inputs(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return each_vetted(request, context) if streamed else await vetted(request, context)

    if inspect.isasyncgenfunction(behavior):

        async def generated(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            async for response in behavior(await inputs(request, context), context):
                yield response

        wrapped: Any = generated
    elif inspect.iscoroutinefunction(behavior):

        async def awaited(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            return await behavior(await inputs(request, context), context)

        wrapped = awaited
    else:
        return handler  # type: ignore[no-any-return]
    decoded: grpc.RpcMethodHandler[Any, Any] = handler._replace(
        **{kind: wrapped}, request_deserializer=_safe(handler.request_deserializer)
    )
    return decoded
