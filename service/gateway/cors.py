"""Cross-origin access to the HTTP API, for pages served from other origins.

Origins are listed in the settings (`"*"` allows any); with none listed, only
same-origin pages (like the adapter's own page) may call the API. A preflight
(`OPTIONS` with `Access-Control-Request-Method`) from an allowed origin is
answered at once; the headers of actual responses are added just before they
are sent, so streamed (SSE) responses carry them too.

Against cross-site request forgery, a state-changing request (any method but
GET, HEAD and OPTIONS) whose `Origin` is neither allowed nor the adapter's own
(the `Host` it was sent to) is refused with 403 before it reaches a route.
Browsers send `Origin` on every such request; clients that are not browsers
send none and are not concerned.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import urlsplit

import grpc
import orjson
from aiohttp import web

from service.gateway.status import failure, shown

ALLOWED_METHODS = "GET, POST, PUT, PATCH, DELETE"
ALLOWED_HEADERS = "Content-Type, Authorization, Last-Event-ID, X-Request-Id"
MAX_AGE_S = 600
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Cors:
    """The CORS policy: a middleware for preflights and a hook for response headers."""

    def __init__(self, origins: Iterable[str]) -> None:
        self.origins = frozenset(origins)
        self.any = "*" in self.origins

    def allowed(self, origin: str) -> bool:
        return self.any or origin in self.origins

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin", "")
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            if not origin or not self.allowed(origin):
                return _forbidden(origin)
            requested = request.headers.get("Access-Control-Request-Headers", "")
            return web.Response(
                status=204,
                headers={
                    "Access-Control-Allow-Methods": ALLOWED_METHODS,
                    "Access-Control-Allow-Headers": requested or ALLOWED_HEADERS,
                    "Access-Control-Max-Age": str(MAX_AGE_S),
                },
            )
        if (
            origin
            and request.method not in SAFE_METHODS
            and not self.allowed(origin)
            and not same_origin(origin, request.headers.get("Host", ""))
        ):
            return _forbidden(origin)
        return await handler(request)

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """Add the CORS headers to a response about to be sent."""
        origin = request.headers.get("Origin", "")
        if not origin or not self.origins:
            return
        if self.allowed(origin):
            response.headers["Access-Control-Allow-Origin"] = "*" if self.any else origin
            if not self.any:
                response.headers.add("Vary", "Origin")


def same_origin(origin: str, host: str) -> bool:
    """Whether `origin` (scheme://authority) names the authority the request was sent to.

    Browsers write both without a default port, so the authorities compare as text.
    """
    try:
        authority = urlsplit(origin).netloc
    except ValueError:
        return False
    return bool(authority) and authority.lower() == host.lower()


def _forbidden(origin: str) -> web.Response:
    message = f"origin {shown(origin)!r} is not allowed"
    envelope = failure(grpc.StatusCode.PERMISSION_DENIED, message)
    return web.Response(status=403, body=orjson.dumps(envelope), content_type="application/json")
