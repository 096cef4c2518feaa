"""The HTTP/SSE adapter: an aiohttp server whose API routes come from the proto.

For every annotated RPC of the given services (`routes_of`) one generic
handler is registered: it transcodes the HTTP request into the request
message, calls the RPC over a gRPC channel, and answers with the unary
envelope or, for server-streaming RPCs, with Server-Sent Events (a stream of
`google.api.HttpBody` with the raw bytes it carries, gateway/body.py). Adding an
annotated RPC to the proto adds its route; there is no per-RPC code.

The channel may point at a gRPC server in another process
(`python -m service.gateway --grpc-target HOST:PORT`) or at the one running in
this process (`App` does that by default). The adapter also serves the web page
(`/`, `static/`), answers only the allowed `Host`s (`hosts`), applies CORS and
the origin check (`cors`) and request-size limits, takes request bodies only as
JSON (`Content-Type: application/json` or `application/*+json`, else 415),
and answers every failure under `/api/` with the error envelope; a request
that does not fit its RPC is one log line and a 400, never a traceback.
"""

from __future__ import annotations

import logging
import re
import ssl
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import grpc
import orjson
from agw.v1 import gateway_pb2
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import Message

from service.gateway import agui, codec
from service.gateway.a2a import A2AEndpoint
from service.gateway.body import HTTP_BODY, serve_body
from service.gateway.cors import Cors
from service.gateway.hosts import LOOPBACK_HOSTS, AllowedHosts
from service.gateway.metadata import metadata_of
from service.gateway.routes import Route, routes_of
from service.gateway.sse import EventStream
from service.gateway.status import failure, retry_after, rpc_failure, shown, success
from service.gateway.transcode import BadRequest, decode_request

log = logging.getLogger("agw.http")
#: aiohttp's own log of each connection's failures (`_quiet_client_faults` below).
protocol_log = logging.getLogger("agw.http.protocol")

STATIC_DIR = Path(__file__).parent / "static"
AGENT_GATEWAY = gateway_pb2.DESCRIPTOR.services_by_name["AgentGateway"]
CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 60_000),
)
#: Methods whose requests carry a body, which must then be JSON.
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
#: The largest seq a client may resume after (an int64).
MAX_SEQ = 2**63 - 1
_SEQ = re.compile(r"[0-9]{1,19}")
_JSON_TYPE = re.compile(r"application/(?:[a-z0-9!#$&^_.-]+\+)?json")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HttpGateway:
    """The HTTP server in front of a gRPC target."""

    def __init__(
        self,
        grpc_target: str,
        *,
        services: Sequence[ServiceDescriptor] = (AGENT_GATEWAY,),
        heartbeat_s: float = 10.0,
        write_timeout_s: float = 30.0,
        max_body_bytes: int = 16 * 1024 * 1024,
        cors_origins: Iterable[str] = (),
        allowed_hosts: Iterable[str] = LOOPBACK_HOSTS,
        serve_page: bool = True,
        grpc_credentials: grpc.ChannelCredentials | None = None,
        grpc_options: Sequence[tuple[str, Any]] = (),
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """`grpc_credentials`: call a TLS gRPC target; `ssl_context`: serve HTTPS."""
        self.grpc_target = grpc_target
        self.grpc_credentials = grpc_credentials
        self.grpc_options = (*CHANNEL_OPTIONS, *grpc_options)
        self.ssl_context = ssl_context
        self.routes = routes_of(*services)
        self.heartbeat_s = heartbeat_s
        self.write_timeout_s = write_timeout_s
        self.max_body_bytes = max_body_bytes
        self.cors = Cors(cors_origins)
        self.hosts = AllowedHosts(allowed_hosts)
        self.serve_page = serve_page
        self.streams: set[EventStream] = set()  # the SSE responses being served
        self.channel: grpc.aio.Channel | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- lifecycle ---------------------------------------------------------------------

    def application(self) -> web.Application:
        """The aiohttp application (routes, page, middlewares); opens the gRPC channel."""
        if self.grpc_credentials is not None:
            self.channel = grpc.aio.secure_channel(
                self.grpc_target, self.grpc_credentials, options=self.grpc_options
            )
        else:
            self.channel = grpc.aio.insecure_channel(self.grpc_target, options=self.grpc_options)
        app = web.Application(
            client_max_size=self.max_body_bytes,
            middlewares=[self.hosts.middleware, self.cors.middleware, _envelopes],
        )
        app.on_response_prepare.append(self.cors.on_prepare)
        for route in self.routes:
            app.router.add_route(route.http_method, route.path, self._handler(route))
        A2AEndpoint(self.channel, write_timeout_s=self.write_timeout_s).add_routes(app.router)
        agui.add_routes(app, self)
        if self.serve_page:
            app.router.add_get("/", _index)
            app.router.add_static("/static/", STATIC_DIR, append_version=False)
        return app

    async def start(self, address: str, *, reuse_port: bool = False) -> None:
        """Listen on `address` ("host:port"; port 0 picks a free one); its host is allowed.

        `reuse_port`: bind with SO_REUSEPORT, shared with other worker processes."""
        host, _, port = address.rpartition(":")
        self.hosts.bind(address)
        self._runner = web.AppRunner(
            self.application(),
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=5.0,
            logger=protocol_log,
        )
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            host.strip("[]") or None,
            int(port),
            ssl_context=self.ssl_context,
            reuse_port=reuse_port or None,
        )
        await site.start()
        self.port = self._runner.addresses[0][1]
        log.info(
            "HTTP listening on %s (port %d), calling gRPC at %s: page at %s://%s:%d/",
            address,
            self.port,
            self.grpc_target,
            "https" if self.ssl_context is not None else "http",
            host or "127.0.0.1",
            self.port,
        )

    async def stop(self) -> None:
        """Close the listener and the open connections, then the channel."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.channel is not None:
            await self.channel.close()
            self.channel = None

    # -- handlers ----------------------------------------------------------------------

    def _handler(self, route: Route) -> Handler:
        assert self.channel is not None
        serialize = _serializer
        deserialize = route.response_class.FromString
        if route.streaming and route.method.output_type.full_name == HTTP_BODY:
            body_call = self.channel.unary_stream(route.full_method, serialize, deserialize)

            async def raw(request: web.Request) -> web.StreamResponse:
                message = await _decode(route, request)
                call = body_call(message, metadata=metadata_of(request))
                return await serve_body(request, call, self.write_timeout_s)

            return raw
        if route.streaming:
            stream_call = self.channel.unary_stream(route.full_method, serialize, deserialize)
            event_id = _event_id_of(route)
            resume = "after_seq" in route.method.input_type.fields_by_name

            async def streaming(request: web.Request) -> web.StreamResponse:
                message = await _decode(route, request)
                if resume:
                    _resume(message, request.headers.get("Last-Event-ID"))
                call = stream_call(message, metadata=metadata_of(request))
                stream = EventStream(
                    request,
                    call,
                    heartbeat_s=self.heartbeat_s,
                    write_timeout_s=self.write_timeout_s,
                    event_id=event_id,
                )
                self.streams.add(stream)
                try:
                    return await stream.serve()
                finally:
                    self.streams.discard(stream)

            return streaming

        unary_call = self.channel.unary_unary(route.full_method, serialize, deserialize)

        async def unary(request: web.Request) -> web.StreamResponse:
            message = await _decode(route, request)
            try:
                response = await unary_call(message, metadata=metadata_of(request))
            except grpc.aio.AioRpcError as error:
                status, envelope = rpc_failure(error)
                return _json(envelope, status, retry_after(envelope))
            if route.response_body:
                response = getattr(response, route.response_body)
            return _json(success(codec.to_dict(response)))

        return unary


def local_target(grpc_address: str, port: int) -> str:
    """How to reach a gRPC server of this process listening on `grpc_address` (bound `port`)."""
    host = grpc_address.rpartition(":")[0].strip("[]")
    if host in ("", "0.0.0.0", "::", "*"):
        host = "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _decode(route: Route, request: web.Request) -> Message:
    if request.method in BODY_METHODS:
        _require_json(request)
    body = await request.read() if route.body else b""
    return decode_request(route, request.match_info, request.query, body)


def _require_json(request: web.Request) -> None:
    """Refuse (415) a body that does not say it is JSON: no form or text/plain posts."""
    if "Content-Type" in request.headers and _JSON_TYPE.fullmatch(request.content_type):
        return
    given = request.headers.get("Content-Type", "")
    message = (
        f"Content-Type must be application/json, not {shown(given)!r}"
        if given
        else "Content-Type must be application/json"
    )
    log.info("HTTP %s %s refused: %s", request.method, shown(request.path), message)
    raise _EnvelopeError(415, failure(grpc.StatusCode.INVALID_ARGUMENT, message))


def _resume(message: Any, last_event_id: str | None) -> None:
    """Resume after `Last-Event-ID` (the later of it and afterSeq): a seq, 0 to 2^63-1."""
    if message.after_seq < 0:
        raise BadRequest(f"afterSeq must be from 0 to {MAX_SEQ}, not {message.after_seq}")
    if last_event_id is None:
        return
    if not _SEQ.fullmatch(last_event_id) or int(last_event_id) > MAX_SEQ:
        raise BadRequest(
            f"Last-Event-ID must be a seq from 0 to {MAX_SEQ}, not {shown(last_event_id)!r}"
        )
    message.after_seq = max(message.after_seq, int(last_event_id))


def _event_id_of(route: Route) -> Callable[[Message], int] | None:
    seq = route.method.output_type.fields_by_name.get("seq")
    if seq is None or seq.is_repeated or seq.cpp_type not in _INTEGER_TYPES:
        return None
    return lambda message: int(getattr(message, "seq"))  # noqa: B009


_INTEGER_TYPES = frozenset({1, 2, 3, 4})  # CPPTYPE_INT32, INT64, UINT32, UINT64


def _serializer(message: Message) -> bytes:
    return message.SerializeToString()


def _json(
    body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps(body), content_type="application/json", headers=headers
    )


class _EnvelopeError(Exception):
    """Answer the request with this HTTP status and error envelope."""

    def __init__(self, status: int, envelope: dict[str, Any]) -> None:
        super().__init__(envelope["msg"])
        self.status = status
        self.envelope = envelope


#: HTTP errors raised by aiohttp itself (no route, body too large, ...) → gRPC code.
_CODE_OF_HTTP = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


@web.middleware
async def _envelopes(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure under /api/ as the error envelope."""
    try:
        return await handler(request)
    except _EnvelopeError as error:
        return _json(error.envelope, error.status)
    except BadRequest as error:
        log.info("HTTP %s %s: bad request: %s", request.method, shown(request.path), error)
        return _json(failure(grpc.StatusCode.INVALID_ARGUMENT, str(error)), 400)
    except web.HTTPException as error:
        if not request.path.startswith("/api/") or error.status < 400:
            raise
        code = _CODE_OF_HTTP.get(error.status, grpc.StatusCode.UNKNOWN)
        message = shown(error.text or error.reason, 160)
        if error.status == 404:
            message = f"no route for {request.method} {shown(request.path)}"
        elif error.status == 405:
            message = f"{request.method} is not allowed on {shown(request.path)}"
        envelope = failure(code, message.removeprefix(f"{error.status}: "))
        return _json(envelope, error.status)
    except Exception:
        if not request.path.startswith("/api/"):
            raise
        log.exception("HTTP %s %s failed", request.method, request.path)
        return _json(failure(grpc.StatusCode.INTERNAL, "internal error"), 500)


def _quiet_client_faults(record: logging.LogRecord) -> bool:
    """A request aiohttp could not parse is the client's fault: one INFO line, no traceback.

    aiohttp logs it at ERROR with its traceback, so that any client could fill the logs
    (and trip alerts) at will; a failure of ours still logs as aiohttp logs it.
    """
    error = record.exc_info[1] if record.exc_info else None
    if isinstance(error, HttpProcessingError) and 400 <= error.code < 500:
        first_line = (error.message or type(error).__name__).strip().split("\n", 1)[0]
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.msg = "HTTP request refused before routing (%d): %s"
        record.args = (error.code, shown(first_line, 160))
        record.exc_info = record.exc_text = None
    return True


protocol_log.addFilter(_quiet_client_faults)


async def _index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})
