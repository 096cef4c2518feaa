"""A server-streaming call of `google.api.HttpBody` answered as the raw body it carries.

As grpc-gateway does for `HttpBody`, the response is not JSON or Server-Sent Events but
the bytes themselves: the first message's `content_type` is the response's Content-Type,
each message's `data` is written as it arrives (chunked), so a large file is never held
whole. A call refused before its first message is answered with the error envelope and
its HTTP status; a failure after it cuts the connection (the client sees a short body).

The body is served as a download, never as a page of the adapter's origin: `Content-
Disposition: attachment`, `X-Content-Type-Options: nosniff` and a sandboxing Content
Security Policy, whatever the content type says (a file a tool wrote may be HTML).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import orjson
from aiohttp import web

from service.gateway.status import rpc_failure

log = logging.getLogger("agw.http")

#: The full name of the message a route's response must be to be served raw.
HTTP_BODY = "google.api.HttpBody"
HEADERS = {
    "Cache-Control": "no-store",
    "Content-Disposition": "attachment",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "sandbox; default-src 'none'",
}


async def serve_body(request: web.Request, call: Any, write_timeout_s: float) -> web.StreamResponse:
    """Answer `request` with the bytes `call` streams (see the module docstring)."""
    try:
        first = await call.read()
    except grpc.aio.AioRpcError as error:
        status, envelope = rpc_failure(error)
        return web.Response(
            status=status, body=orjson.dumps(envelope), content_type="application/json"
        )
    if first is grpc.aio.EOF:
        return web.Response(status=204)
    response = web.StreamResponse(
        headers={**HEADERS, "Content-Type": first.content_type or "application/octet-stream"}
    )
    try:
        await response.prepare(request)
        message = first
        while message is not grpc.aio.EOF:
            async with asyncio.timeout(write_timeout_s):
                await response.write(message.data)
            message = await call.read()
        await response.write_eof()
    except grpc.aio.AioRpcError as error:
        log.info("HTTP %s: the body was cut: %s", request.path[:200], error.code().name)
        if request.transport is not None:
            request.transport.abort()
    except (TimeoutError, ConnectionResetError):
        log.info("HTTP %s: the client stopped reading; closing", request.path[:200])
        if request.transport is not None:
            request.transport.abort()
    finally:
        call.cancel()
    return response
