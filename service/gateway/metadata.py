"""HTTP request headers → the gRPC metadata of the call.

`Authorization`, `X-Request-Id` and `traceparent` are passed on, and every
`Grpc-Metadata-<key>` header as `<key>` (grpc-gateway's convention). gRPC is
stricter than HTTP, so each header is checked here rather than failing inside
the call: a key is lower-case letters, digits, `-`, `_` and `.`, and not one
gRPC reserves (`grpc-*`, and the HTTP/2 headers it sets itself); a value is
printable ASCII, except under a key ending in `-bin`, whose value is base64
(standard or URL-safe, padding optional) and is passed on as the bytes it
encodes. A header that breaks these rules raises `BadRequest`.

The HTTP client's address goes along as `x-forwarded-for` (`CLIENT_KEY`): the
service logs it as the call's peer when the call comes over the adapter's
private unix socket (`AGW_WORKERS`), where the transport's own peer says
nothing. The adapter sets it alone: a `Grpc-Metadata-X-Forwarded-For` header
is dropped.
"""

from __future__ import annotations

import base64
import binascii
import re

from aiohttp import web

from service.gateway.status import shown
from service.gateway.transcode import BadRequest

#: HTTP headers passed to the service as gRPC metadata (besides `Grpc-Metadata-*`).
FORWARDED_HEADERS = frozenset({"authorization", "x-request-id", "traceparent"})
PREFIX = "grpc-metadata-"
#: The metadata key carrying the HTTP client's address.
CLIENT_KEY = "x-forwarded-for"
#: Keys gRPC sets itself; `grpc-*` is reserved as a whole.
RESERVED_KEYS = frozenset(
    {"content-type", "te", "user-agent", "host", "connection", "keep-alive", "transfer-encoding"}
)

_KEY = re.compile(r"[0-9a-z_.\-]+")
_PRINTABLE = re.compile(r"[\x20-\x7e]*")

Metadata = tuple[tuple[str, str | bytes], ...]


def metadata_of(request: web.BaseRequest) -> Metadata:
    """The gRPC metadata of the request's call: what its headers carry (see the module's
    rules), and the client's address."""
    out: list[tuple[str, str | bytes]] = []
    for name, value in request.headers.items():
        lowered = name.lower()
        if lowered.startswith(PREFIX):
            key = lowered.removeprefix(PREFIX)
        elif lowered in FORWARDED_HEADERS:
            key = lowered
        else:
            continue
        if key != CLIENT_KEY:
            out.append((key, _checked(name, key, value)))
    if request.remote:
        out.append((CLIENT_KEY, request.remote))
    return tuple(out)


def _checked(header: str, key: str, value: str) -> str | bytes:
    if not _KEY.fullmatch(key) or key.startswith("grpc-") or key in RESERVED_KEYS:
        raise BadRequest(f"header {shown(header)!r} is not a usable gRPC metadata key")
    if key.endswith("-bin"):
        text = value.strip().replace("-", "+").replace("_", "/")
        try:
            return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(f"header {shown(header)!r} must be base64 (a -bin key)") from None
    if not _PRINTABLE.fullmatch(value):
        raise BadRequest(f"header {shown(header)!r} must be printable ASCII")
    return value
