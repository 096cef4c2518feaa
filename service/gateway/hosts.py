"""The `Host` header allow list, against DNS rebinding.

A page on a hostile site can make its own name resolve to this adapter's
address (DNS rebinding) and then call it as same-origin; the request still
names the hostile site in its `Host` header. So only the names listed in the
settings are served (default: the loopback names `localhost`, `127.0.0.1`
and `[::1]`), plus the host of the address the adapter is bound to when that
is not a wildcard. An entry matches any port unless it names one
(`example.com:8443`); `.example.com` matches that domain and its subdomains;
`*` matches every host. Any other request, the page included, is answered
`421 Misdirected Request` with the error envelope. A request without a `Host`
header (HTTP/1.0 clients; never a browser) is served.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Iterable

import grpc
import orjson
from aiohttp import web

from service.gateway.status import failure, shown

log = logging.getLogger("agw.http")

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::", "[::]", "*"})
MISDIRECTED = 421

_PORT = re.compile(r"[0-9]{1,5}")
_NAME = re.compile(r"[a-z0-9_.-]+|\[[0-9a-f:.]+\]")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AllowedHosts:
    """The hosts the adapter answers for; a middleware refuses the others."""

    def __init__(self, entries: Iterable[str]) -> None:
        self.any = False
        self.names: set[str] = set()  # any port
        self.domains: set[str] = set()  # ".example.com": the domain and its subdomains
        self.authorities: set[tuple[str, str]] = set()  # (name, port)
        for entry in entries:
            self.add(entry)

    def add(self, entry: str) -> None:
        """Allow one more entry (see the module's forms)."""
        text = entry.strip().lower()
        if text == "*":
            self.any = True
        elif text.startswith("."):
            self.domains.add(text.rstrip("."))
        elif (parsed := split_host(text)) is None:
            raise ValueError(f"not a host or host:port: {entry!r}")
        elif parsed[1]:
            self.authorities.add(parsed)
        else:
            self.names.add(parsed[0])

    def bind(self, address: str) -> None:
        """Allow the host of the listen address `address` ("host:port") unless a wildcard."""
        host = address.rpartition(":")[0]
        if host.lower() not in WILDCARD_BINDS:
            self.add(host)

    def allows(self, host_header: str) -> bool:
        if self.any:
            return True
        parsed = split_host(host_header.lower())
        if parsed is None:
            return False
        name, port = parsed
        if name in self.names or (name, port) in self.authorities:
            return True
        return any(name == d[1:] or name.endswith(d) for d in self.domains)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get("Host")
        if host is None or self.allows(host):
            return await handler(request)
        log.info("HTTP %s refused: host %r is not allowed", request.method, shown(host))
        message = (
            f"host {shown(host)!r} is not served here: list it in AGW_HTTP_ALLOWED_HOSTS "
            "(the standalone adapter: --allowed-host)"
        )
        envelope = failure(grpc.StatusCode.INVALID_ARGUMENT, message)
        return web.Response(
            status=MISDIRECTED, body=orjson.dumps(envelope), content_type="application/json"
        )


def split_host(text: str) -> tuple[str, str] | None:
    """("name", "port") of "name", "name:port", "[v6]" or "[v6]:port"; None if malformed.

    The name is normalised: an IPv6 literal keeps its brackets, a trailing dot goes.
    """
    if text.startswith("["):
        name, bracket, rest = text.partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        name += bracket
        colon, port = bool(rest), rest[1:]
    elif text.count(":") > 1:  # a bare IPv6 literal, as a setting may write it
        name, colon, port = f"[{text}]", False, ""
    else:
        name, separator, port = text.partition(":")
        name, colon = name.rstrip("."), bool(separator)
    if not _NAME.fullmatch(name) or (colon and not _PORT.fullmatch(port)):
        return None
    return name, port
