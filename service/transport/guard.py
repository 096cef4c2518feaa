"""The door of every gateway RPC: admission, authentication, undecodable requests.

`GatewayGuard` is a grpc.aio server interceptor. For each call to the
`agw.v1.AgentGateway` service it
- decodes the request itself, so that bytes that are not the request message
  end the call with INVALID_ARGUMENT and one log line (not UNKNOWN and a
  traceback);
- authenticates the caller (`service.transport.auth`) and ends the call with
  UNAUTHENTICATED when the credentials do not fit;
- makes the caller's principal available to the handler (`principal()`).

Health and reflection calls are not authenticated; their requests are decoded
safely too (`_decoded_safely`).
"""

from __future__ import annotations

import contextvars
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from service.core.commands import ANONYMOUS, Principal
from service.core.errors import AgwError, InvalidRequest
from service.transport.auth import Authenticator
from service.transport.errors import abort

log = logging.getLogger("agw.grpc")

SERVICE_PREFIX = "/agw.v1.AgentGateway/"

_principal: contextvars.ContextVar[Principal] = contextvars.ContextVar(
    "agw_principal", default=ANONYMOUS
)


def principal() -> Principal:
    """The principal of the call being handled."""
    return _principal.get()


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


class GatewayGuard(grpc.aio.ServerInterceptor):
    """Decodes safely and authenticates every call of the gateway service."""

    def __init__(self, authenticator: Authenticator) -> None:
        self.authenticator = authenticator

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
            **{kind: self._guarded(name, getattr(handler, kind))},
            request_deserializer=_safe(handler.request_deserializer),
        )
        return guarded

    def _guarded(self, name: str, behavior: Any) -> Callable[[Any, Any], Awaitable[Any]]:
        authenticator = self.authenticator

        async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            try:
                if isinstance(request, Undecodable):
                    log.warning("%s: undecodable request (%s)", name, request.error[:200])
                    raise InvalidRequest(f"the request is not a valid {name} request")
                metadata = {
                    k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)
                }
                who = await authenticator.authenticate(metadata)
            except AgwError as error:
                await abort(context, error)
                return None
            _principal.set(who)
            return await behavior(request, context)

        return guarded


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
