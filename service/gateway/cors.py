"""Cross-origin access to the HTTP API, for pages served from other origins.

Origins are listed in the settings (`"*"` allows any); with none listed, only
same-origin pages (like the adapter's own page) may call the API. A preflight
(`OPTIONS` with `Access-Control-Request-Method`) from an allowed origin is
answered at once; the headers of actual responses are added just before they
are sent, so streamed (SSE) responses carry them too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import grpc
import orjson
from aiohttp import web

from service.gateway.status import failure

ALLOWED_METHODS = "GET, POST, PUT, PATCH, DELETE"
ALLOWED_HEADERS = "Content-Type, Authorization, Last-Event-ID, X-Request-Id"
MAX_AGE_S = 600

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
                message = f"origin {origin!r} is not allowed"
                envelope = failure(grpc.StatusCode.PERMISSION_DENIED, message)
                return web.Response(
                    status=403, body=orjson.dumps(envelope), content_type="application/json"
                )
            requested = request.headers.get("Access-Control-Request-Headers", "")
            return web.Response(
                status=204,
                headers={
                    "Access-Control-Allow-Methods": ALLOWED_METHODS,
                    "Access-Control-Allow-Headers": requested or ALLOWED_HEADERS,
                    "Access-Control-Max-Age": str(MAX_AGE_S),
                },
            )
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
