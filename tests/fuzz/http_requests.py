"""Hostile HTTP requests to the adapter, as Hypothesis strategies.

`requests(service, route)` builds a request to a route of the proto's
annotations (or, with no route, the page, a static file, an unknown path): any
method, the path's variables filled with ids or junk (percent-encoded, or raw
`..` segments), a query string of field names and junk, the headers browsers and
proxies send (Content-Type, Host, Origin, Last-Event-ID, Authorization,
Grpc-Metadata-*), and a JSON body built from the request message's fields, or
random JSON, or random bytes. Paths and queries come encoded, as they go on the
wire.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import orjson
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import strategies as st

from service.gateway.routes import Route, routes_of
from service.gateway.server import AGENT_GATEWAY
from tests.fuzz.kit import AGENT_KEYS, ALICE_KEY, COMMANDS, WORKSPACE_PATHS, FuzzService, tokens
from tests.fuzz.protos import BOUNDED, TIMEOUTS_MS, WEBHOOK_URLS, json_values, strings

ROUTES = routes_of(AGENT_GATEWAY)
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD")


@dataclass
class HttpRequest:
    """One request as it goes on the wire (path and query already encoded)."""

    method: str
    path: str
    query: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes | None = None
    route: Route | None = None
    answer: bytes | None = None  # the Submit body's payload for a waiting tool; None: cancel

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


printable = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30)

#: Path segments that escape when a server decodes or normalises them.
RAW_SEGMENTS = ("..", "../..", "%2e%2e", "%2E%2E%2F%2E%2E", "..%2f..%2f", ".%00.", "%00", "a%0a")


def segments(service: FuzzService, wild: int) -> st.SearchStrategy[str]:
    """A value for a path variable: a real id, or (wild) junk encoded, or a raw escape."""
    real = service.ids.values("runs").map(lambda s: quote(s, safe=""))
    junk = strings().map(lambda s: quote(s, safe="")) | st.sampled_from(RAW_SEGMENTS)
    return _one_in(wild).flatmap(lambda go: junk if go else real)


def files(wild: int) -> st.SearchStrategy[str]:
    """A file of a workspace (a path variable of several segments), or a way out of it."""
    real = st.sampled_from(WORKSPACE_PATHS).map(lambda s: quote(s, safe="/"))
    junk = strings().map(lambda s: quote(s, safe="/")) | st.sampled_from(RAW_SEGMENTS)
    return _one_in(wild).flatmap(lambda go: junk if go else real)


def paths(service: FuzzService, route: Route | None, wild: int) -> st.SearchStrategy[str]:
    """The path of `route` (variables filled, maybe bent), or the page, a static file, junk."""
    if route is None:
        static = ["/", "/static/app.js", "/static/", "/static/../../../../etc/passwd"]
        static += ["/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd", "/static/..%2f..%2fservice/app.py"]
        junk = strings().map(lambda s: "/api/" + quote(s, safe="/"))
        return st.sampled_from(static) | junk
    return _filled(service, route, wild)


@st.composite
def _filled(draw: st.DrawFn, service: FuzzService, route: Route, wild: int) -> str:
    path = route.template
    for _, name in route.variables:
        value = draw(files(wild) if name == "path" else segments(service, wild))
        variable = re.compile(r"\{" + re.escape(name) + r"(=[^}]*)?\}")
        path = variable.sub(value.replace("\\", "\\\\"), path)
    if not draw(_one_in(wild)):
        return path
    bend = draw(st.sampled_from(["", "/", "/..", "//", "/%2e%2e", "?"]))
    prefix = draw(st.sampled_from(["", "/", "/api/..", "/API"]))
    return prefix + path + bend


def _one_in(n: int) -> st.SearchStrategy[bool]:
    return st.sampled_from([True] + [False] * (n - 1))


#: Fields given real values (an agent's key, a run's id...) unless wild.
HINTED = frozenset({"agent_key", "message", "run_id", "chat_id", "tool_id"})


def field_value(field: FieldDescriptor, service: FuzzService, wild: int) -> st.SearchStrategy[Any]:
    """A JSON value for `field`: a real one (named fields), or of its type, or any JSON."""
    if field.name in BOUNDED:
        return TIMEOUTS_MS
    hinted = {
        "agent_key": st.sampled_from(AGENT_KEYS),
        "message": st.sampled_from(("Hi", *COMMANDS)),
        "run_id": service.ids.values("runs"),
        "chat_id": (
            st.just("") | service.ids.values("chats")  # a query may start a new chat
            if field.containing_type.name == "QueryRequest"
            else service.ids.values("chats")
        ),
        "tool_id": service.ids.values("tools"),
        "url": WEBHOOK_URLS | strings(),
    }.get(field.name)
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        typed = strings()
    elif kind == FieldDescriptor.TYPE_BOOL:
        typed = st.booleans()
    elif kind == FieldDescriptor.TYPE_BYTES:
        typed = st.binary(max_size=64).map(lambda b: base64.b64encode(b).decode()) | strings()
    elif kind == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        names = [v.name for v in field.enum_type.values]
        typed = st.sampled_from(names) | st.integers(-(2**31), 2**31 - 1) | strings()
    elif kind == FieldDescriptor.TYPE_MESSAGE:
        typed = json_values(finite=True)
    else:
        typed = st.integers(-(2**64), 2**64) | st.sampled_from(["1", "1e999", "-0", "NaN"])
    if field.is_repeated:
        typed = st.lists(typed, max_size=3)
    generated = typed | json_values(finite=True)
    if hinted is None:
        return generated
    return _one_in(wild).flatmap(lambda go: generated if go else hinted)


@st.composite
def objects(
    draw: st.DrawFn, descriptor: Descriptor, service: FuzzService, wild: int
) -> dict[str, Any]:
    """A JSON object for `descriptor`: the fields that name things, others when wild."""
    out: dict[str, Any] = {}
    for member in descriptor.fields:
        if member.name not in HINTED and not draw(_one_in(wild)):
            continue
        name = draw(st.sampled_from([member.json_name, member.json_name, member.name]))
        out[name] = draw(field_value(member, service, wild))
    if draw(_one_in(wild * 2)):
        out[draw(strings())] = draw(json_values(finite=True))
    return out


#: Bodies no JSON parser should take well.
RAW_BODIES: tuple[tuple[bytes, int], ...] = (
    (b"", 1),
    (b"null", 1),
    (b"[]", 1),
    (b"{", 1),
    (b'{"a":NaN}', 1),
    (b'{"agentKey":"oneshot","message":"Hi","params":{"x":1e999}}', 1),
    (b'{"agentKey":"oneshot","agentKey":"plan","message":"Hi"}', 1),
    (b'{"agentKey":"oneshot","message":"\\ud800 lone"}', 1),
    (b'{"agentKey":"oneshot","message":"Hi","params":{"\\udfff":"\\u0000"}}', 1),
    (b"\xef\xbb\xbf{}", 1),
    (b"\xff\xfe{\x00}\x00", 1),
    (b"[", 5000),
    (b'{"a":' * 3000 + b"1" + b"}" * 3000, 1),
    (b"x", 70_000),
)


def bodies(route: Route | None, service: FuzzService, wild: int) -> st.SearchStrategy[bytes | None]:
    """The body of a request to `route`: its message's fields as JSON, or (wild) junk."""
    raw = st.sampled_from(RAW_BODIES).map(lambda piece: piece[0] * piece[1])
    junk = st.one_of(raw, st.binary(max_size=64), json_values().map(_dumps), st.none())
    if route is None or not route.body:
        return _one_in(wild).flatmap(lambda go: junk if go else st.none())
    fields = objects(route.method.input_type, service, wild).map(_dumps)
    return _one_in(wild).flatmap(lambda go: junk if go else fields)


def _dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):  # NaN is null to orjson; huge ints fail
        return repr(value).encode()


@st.composite
def queries(draw: st.DrawFn, route: Route | None, service: FuzzService, wild: int) -> str:
    """A query string: the route's fields that name things (with real values when tame),
    then (wild) field names, dotted and unknown ones, with junk values."""
    pairs: list[tuple[str, str]] = []
    names = ["x", "params.a", "agent_key.x", "afterSeq", "runId"]
    if route is not None and not route.body:
        bound = {name for _, name in route.variables}
        for member in route.method.input_type.fields:
            names += [member.name, member.json_name]
            if member.name in HINTED and member.name not in bound:
                value = draw(field_value(member, service, wild))
                pairs.append((member.json_name, value if isinstance(value, str) else _text(value)))
    if draw(_one_in(wild)):
        keys = st.sampled_from(names) | strings()
        values = st.one_of(
            strings(),
            st.sampled_from(["true", "0", "-1", "9" * 30, "{}", '{"a":1}', "[1]", "null"]),
            st.sampled_from(AGENT_KEYS),
            service.ids.values("chats"),
        )
        pairs += draw(st.lists(st.tuples(keys, values), max_size=4))
    return "&".join(f"{quote(key)}={quote(value)}" for key, value in pairs)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else _dumps(value).decode(errors="replace")


def authorizations(wild: int) -> st.SearchStrategy[str | None]:
    valid = st.just(f"Bearer {ALICE_KEY}")
    other = st.sampled_from([f"Bearer {t}" for t in tokens()]) | printable | st.none()
    return _one_in(wild).flatmap(lambda go: other if go else valid)


@st.composite
def headers(draw: st.DrawFn, method: str, wild: int) -> list[tuple[str, str]]:
    """The headers of a request: those it needs, and (wild) odd ones or odd values."""
    out: list[tuple[str, str]] = []
    if method in ("POST", "PUT", "PATCH") and not draw(_one_in(wild)):
        out.append(("Content-Type", "application/json"))
    optional: dict[str, st.SearchStrategy[str]] = {
        "Content-Type": st.sampled_from(
            [
                "application/json",
                "application/json",
                "application/json; charset=utf-8",
                "application/merge-patch+json",
                "APPLICATION/JSON",
                "text/plain",
                "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=x",
                "application/jsonx",
                "",
            ]
        )
        | printable,
        "Host": st.sampled_from(
            ["localhost", "127.0.0.1:1", "[::1]", "localhost.", "evil.example", "a:b:c", ""]
        )
        | printable,
        "Origin": st.sampled_from(
            ["http://app.example", "http://evil.example", "null", "http://localhost", "::"]
        )
        | printable,
        "Last-Event-ID": st.sampled_from(["0", "3", "99999999999999999999", "-1", " 5", "1e3"])
        | printable,
        "X-Request-Id": printable,
        "traceparent": printable,
    }
    for name, values in optional.items():
        if draw(_one_in(wild)):
            out = [(k, v) for k, v in out if k != name or draw(_one_in(wild))]  # or twice
            out.append((name, draw(values)))
    authorization = draw(authorizations(wild))
    if authorization is not None:
        out.append(("Authorization", authorization))
    for _ in range(draw(st.integers(0, 2)) if draw(_one_in(wild)) else 0):
        key = draw(st.sampled_from(["x-a", "trace-bin", "grpc-timeout", "content-type", "A B"]))
        value = draw(printable | st.sampled_from(["AP--_w", "AP++/w==", "!!", "=" * 5]))
        out.append((f"Grpc-Metadata-{key}", value))
    return out


@st.composite
def requests(draw: st.DrawFn, service: FuzzService, route: Route | None) -> HttpRequest:
    """A hostile request to `route` (None: the page, static files, unknown paths).

    Each part of it goes wild one time in `wild` (drawn first): many requests are
    wrong in one way only, and reach the service; others are wrong everywhere.
    """
    wild = draw(st.sampled_from([2, 8, 40, 40]), label="one part in")
    method = route.http_method if route else "GET"
    if draw(_one_in(wild)):
        method = draw(st.sampled_from(METHODS))
    return HttpRequest(
        method=method,
        path=draw(paths(service, route, wild)),
        query=draw(queries(route, service, wild)),
        headers=draw(headers(method, wild)),
        body=draw(bodies(route, service, wild)),
        route=route,
        answer=draw(st.none() | json_values().map(_dumps)),
    )
