"""The adapter's defences: allowed hosts, origins, JSON bodies, headers, bounded echoes.

Through real HTTP in front of the scripted gRPC service (what reaches the
service is recorded), and in front of the whole service where a run could
start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.gateway.hosts import AllowedHosts
from service.gateway.server import HttpGateway
from service.testing import Harness
from tests.gateway.conftest import Adapter, ScriptedService

QUERY = {"agentKey": "plain", "message": "Hi there"}
CANCEL = b'{"runId": "r1"}'


@pytest.fixture
async def hosts(scripted: ScriptedService) -> AsyncIterator[HttpGateway]:
    """An adapter allowing `app.example` (any port), `.corp.example` and `api.example:8443`."""
    allowed = ["app.example", ".corp.example", "api.example:8443"]
    gateway = HttpGateway(scripted.target, allowed_hosts=allowed)
    await gateway.start("127.0.0.1:0")
    try:
        yield gateway
    finally:
        await gateway.stop()


def refused(response: httpx.Response, status: int, code: int, needle: str) -> None:
    """`response` is the error envelope with this status and code, naming `needle`."""
    assert response.status_code == status
    assert response.headers["Content-Type"].startswith("application/json")
    body = response.json()
    assert (body["code"], body["data"]) == (code, None)
    assert needle in body["msg"]


# Host (DNS rebinding) ----------------------------------------------------------------


@pytest.mark.parametrize(
    "host", ["localhost", "localhost:8080", "127.0.0.1", "127.0.0.1:1", "[::1]", "[::1]:8080"]
)
async def test_loopback_names_are_served_by_default(host: str, adapter: Adapter) -> None:
    response = await adapter.http.get("/api/agents", headers={"Host": host})
    assert response.status_code == 200 and response.json()["code"] == 0


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8080", "localhost.evil.example", "10.0.0.1", "[::2]"]
)
async def test_other_hosts_are_misdirected(
    host: str, adapter: Adapter, scripted: ScriptedService
) -> None:
    for path in ("/api/agents", "/", "/static/app.js"):
        response = await adapter.http.get(path, headers={"Host": host})
        refused(
            response,
            421,
            3,
            f"host {host!r} is not served here: list it in AGW_HTTP_ALLOWED_HOSTS "
            "(the standalone adapter: --allowed-host)",
        )
    response = await adapter.http.post("/api/cancel", json={"runId": "r1"}, headers={"Host": host})
    assert response.status_code == 421
    assert scripted.requests == []


@pytest.mark.parametrize(
    ("host", "served"),
    [
        ("app.example", True),
        ("APP.example:9000", True),
        ("app.example.", True),
        ("corp.example", True),
        ("a.b.corp.example:80", True),
        ("api.example:8443", True),
        ("api.example", False),
        ("api.example:8444", False),
        ("xcorp.example", False),
        ("localhost", False),  # a list replaces the loopback default...
        ("127.0.0.1", True),  # ...but the bound address's host is always served
        ("app.example:", False),
        ("app.example:http", False),
        ("[::1", False),
    ],
)
async def test_a_configured_host_list(host: str, served: bool, hosts: HttpGateway) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{hosts.port}") as http:
        response = await http.get("/api/agents", headers={"Host": host})
    assert response.status_code == (200 if served else 421)


async def test_star_serves_any_host(scripted: ScriptedService) -> None:
    gateway = HttpGateway(scripted.target, allowed_hosts=["*"])
    await gateway.start("127.0.0.1:0")
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}") as http:
            response = await http.get("/api/agents", headers={"Host": "anything.example"})
    finally:
        await gateway.stop()
    assert response.status_code == 200


def test_a_wildcard_bind_adds_no_host_and_bad_entries_fail_at_start() -> None:
    allowed = AllowedHosts([])
    for address in ("0.0.0.0:8080", "[::]:8080", ":8080"):
        allowed.bind(address)
    assert not allowed.allows("0.0.0.0:8080") and not allowed.allows("localhost")
    allowed.bind("[::1]:0")
    allowed.bind("10.1.2.3:8080")
    assert allowed.allows("[::1]:8080") and allowed.allows("10.1.2.3")
    assert AllowedHosts(["::1"]).allows("[::1]:1")
    assert not AllowedHosts(["[::1]"]).allows("[::1") and not AllowedHosts(["a"]).allows("a:")
    for bad in ("a b", "host:port", "[::1]x", "[::1", "a:", ""):
        with pytest.raises(ValueError, match="not a host"):
            AllowedHosts([bad])


async def test_the_setting_reaches_the_service_adapter(agents_dir: Path) -> None:
    async with (
        Harness.start(agents_dir, http_allowed_hosts=["app.example"]) as gateway,
        httpx.AsyncClient(base_url=gateway.http_url) as http,
    ):
        allowed = await http.get("/api/agents", headers={"Host": "app.example:8080"})
        bound = await http.get("/api/agents")  # 127.0.0.1: the bound address
        other = await http.get("/api/agents", headers={"Host": "localhost"})
    assert (allowed.status_code, bound.status_code, other.status_code) == (200, 200, 421)


# Origin (cross-site request forgery) ----------------------------------------------------


async def test_a_foreign_origin_cannot_post(adapter: Adapter, scripted: ScriptedService) -> None:
    for origin in ("https://evil.example", "null", "http://127.0.0.1", "http://localhost:1"):
        response = await adapter.http.post(
            "/api/cancel", content=CANCEL, headers={"Origin": origin, "Content-Type": "text/plain"}
        )
        refused(response, 403, 7, f"origin {origin!r} is not allowed")
        response = await adapter.http.post(
            "/api/cancel", json={"runId": "r1"}, headers={"Origin": origin}
        )
        assert response.status_code == 403
    assert scripted.requests == []


async def test_same_origin_and_originless_posts_are_served(
    adapter: Adapter, scripted: ScriptedService
) -> None:
    port = adapter.gateway.port
    for headers in ({"Origin": f"http://127.0.0.1:{port}"}, {}):
        response = await adapter.http.post("/api/cancel", json={"runId": "r1"}, headers=headers)
        assert response.status_code == 200
    same = {"Host": "localhost:1234", "Origin": "http://LOCALHOST:1234"}
    assert (await adapter.http.post("/api/cancel", json={}, headers=same)).status_code == 200
    assert len(scripted.requests) == 3


async def test_foreign_origins_may_still_read(adapter: Adapter) -> None:
    response = await adapter.http.get("/api/agents", headers={"Origin": "https://evil.example"})
    assert response.status_code == 200
    assert "Access-Control-Allow-Origin" not in response.headers


async def test_allowed_origins_post_as_before(scripted: ScriptedService) -> None:
    gateway = HttpGateway(scripted.target, cors_origins=["https://app.example"])
    await gateway.start("127.0.0.1:0")
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}") as http:
            allowed = await http.post(
                "/api/cancel", json={"runId": "r1"}, headers={"Origin": "https://app.example"}
            )
            other = await http.post(
                "/api/cancel", json={"runId": "r1"}, headers={"Origin": "https://evil.example"}
            )
    finally:
        await gateway.stop()
    assert allowed.status_code == 200
    assert allowed.headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert other.status_code == 403


async def test_a_cross_site_text_plain_query_starts_no_run(
    gateway: Harness, http: httpx.AsyncClient
) -> None:
    form = {"Origin": "https://evil.example", "Content-Type": "text/plain"}
    body = b'{"agentKey": "plain", "message": "Hi there"}'
    forged = await http.post("/api/query", content=body, headers=form)
    plain = await http.post("/api/query", content=body, headers={"Content-Type": "text/plain"})
    assert (forged.status_code, plain.status_code) == (403, 415)
    assert gateway.app.frontdoor.runs == {}
    assert (await http.get("/api/chats")).json()["data"] == {}


# Content-Type of bodies ---------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "text/plain",
        "text/plain; charset=utf-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonx",
        "text/json",
        "application/json-seq",
    ],
)
async def test_bodies_must_be_json(
    content_type: str | None, adapter: Adapter, scripted: ScriptedService
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    for path, content in (("/api/cancel", CANCEL), ("/api/query", b""), ("/api/submit", b"")):
        response = await adapter.http.post(path, content=content, headers=headers)
        refused(response, 415, 3, "Content-Type must be application/json")
    assert scripted.requests == []


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/merge-patch+json",
        "application/vnd.agw.v1+json; charset=UTF-8",
    ],
)
async def test_json_content_types_are_accepted(
    content_type: str, adapter: Adapter, scripted: ScriptedService
) -> None:
    response = await adapter.http.post(
        "/api/cancel", content=CANCEL, headers={"Content-Type": content_type}
    )
    assert response.status_code == 200
    assert scripted.requests == [("Cancel", scripted.last("Cancel"))]
    assert scripted.last("Cancel").run_id == "r1"


async def test_the_page_and_readers_need_no_content_type(adapter: Adapter) -> None:
    assert (await adapter.http.get("/api/agents")).status_code == 200
    assert (await adapter.http.get("/")).status_code == 200


# Headers as gRPC metadata ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "needle"),
    [
        ({"Grpc-Metadata-X": "é".encode("latin-1")}, "printable ASCII"),
        ({"Grpc-Metadata-X": "é".encode()}, "printable ASCII"),
        ({"X-Request-Id": "é".encode()}, "printable ASCII"),
        ({"Grpc-Metadata-Grpc-Status": "1"}, "not a usable gRPC metadata key"),
        ({"Grpc-Metadata-": "1"}, "not a usable gRPC metadata key"),
        ({"Grpc-Metadata-A~B": "1"}, "not a usable gRPC metadata key"),
        ({"Grpc-Metadata-Content-Type": "x"}, "not a usable gRPC metadata key"),
        ({"Grpc-Metadata-Te": "x"}, "not a usable gRPC metadata key"),
        ({"Grpc-Metadata-Token-Bin": "not base64!"}, "must be base64"),
        ({"Grpc-Metadata-Grpc-" + "k" * 300: "1"}, "Grpc-" + "k" * 45 + "…'"),
    ],
)
async def test_headers_that_grpc_refuses_are_bad_requests(
    headers: dict[str, Any], needle: str, adapter: Adapter, scripted: ScriptedService
) -> None:
    for response in (
        await adapter.http.get("/api/agents", headers=headers),
        await adapter.http.get("/api/runs/r1/events", headers=headers),
    ):
        refused(response, 400, 3, needle)
    assert scripted.requests == []


async def test_binary_metadata_is_base64_decoded(
    adapter: Adapter, scripted: ScriptedService
) -> None:
    headers = {"Grpc-Metadata-Token-Bin": "AP--_w", "Grpc-Metadata-Trace-Bin": "AP++/w=="}
    assert (await adapter.http.get("/api/agents", headers=headers)).status_code == 200
    metadata = dict(scripted.metadata[-1])
    assert (metadata["token-bin"], metadata["trace-bin"]) == (
        b"\x00\xff\xbe\xff",
        b"\x00\xff\xbe\xff",
    )


# Bounded echoes and quiet logs -----------------------------------------------------------

LONG = "z" * 6000


@pytest.mark.parametrize(
    ("method", "path", "kwargs"),
    [
        ("GET", "/api/" + LONG, {}),
        ("DELETE", "/api/agents" + LONG, {}),
        ("GET", "/api/agent", {"params": {LONG: "x"}}),
        ("GET", "/api/chat", {"params": {"includeRawMessages": LONG}}),
        ("GET", "/api/chats", {"params": {"pageSize": "9" * 6000}}),
        ("POST", "/api/cancel", {"json": {LONG: 1}}),
        ("POST", "/api/query", {"json": {"agentKey": "a", "debugLevel": LONG}}),
        ("POST", "/api/cancel", {"content": LONG, "headers": {"Content-Type": "text/" + LONG}}),
        ("GET", "/api/runs/r1/events", {"headers": {"Last-Event-ID": LONG}}),
        ("GET", "/api/agents", {"headers": {"Host": LONG}}),
        ("POST", "/api/cancel", {"json": {}, "headers": {"Origin": "https://" + LONG}}),
    ],
)
async def test_error_messages_echo_at_most_a_short_cut(
    method: str,
    path: str,
    kwargs: dict[str, Any],
    adapter: Adapter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="agw.http"):
        response = await adapter.http.request(method, path, **kwargs)
    assert 400 <= response.status_code < 500
    message = response.json()["msg"]
    assert len(message) <= 200
    assert "…" in message
    assert all(len(record.getMessage()) <= 300 for record in caplog.records)


@pytest.mark.parametrize(
    "head",
    [
        b"GET /api/agents HTTP/1.1\r\nHost: localhost\r\nGrpc-Metadata-A B: x\r\n\r\n",
        b"GET /api/agents?q=" + b"x" * 9000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n",
        b"GET /api/agents HTTP/9.9\r\n\r\n",
        b"POST /api/cancel HTTP/1.1\r\nHost: localhost\r\nContent-Length: -1\r\n\r\n",
    ],
    ids=["header-name", "long-line", "version", "length"],
)
async def test_a_malformed_http_request_is_one_log_line(
    head: bytes, adapter: Adapter, caplog: pytest.LogCaptureFixture
) -> None:
    """aiohttp logs a request it cannot parse at ERROR with a traceback: any client could
    fill the logs and trip alerts at will. It is the client's fault: one INFO line."""
    with caplog.at_level(logging.DEBUG):
        reader, writer = await asyncio.open_connection("127.0.0.1", adapter.gateway.port)
        writer.write(head)
        answer = await reader.read()
        writer.close()
    assert answer.startswith((b"HTTP/1.0 400 ", b"HTTP/1.1 400 "))
    records = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [(r.name, r.levelname, r.exc_info) for r in records] == [
        ("agw.http.protocol", "INFO", None)
    ]
    message = records[0].getMessage()
    assert message.startswith("HTTP request refused before routing (400): ") and len(message) < 300


async def test_an_undecodable_body_is_one_log_line(
    adapter: Adapter, caplog: pytest.LogCaptureFixture
) -> None:
    headers = {"Content-Type": "application/json"}
    with caplog.at_level(logging.DEBUG):
        response = await adapter.http.post("/api/cancel", content=b"\xff\xfe{", headers=headers)
    refused(response, 400, 3, "invalid JSON")
    records = [r for r in caplog.records if r.name.startswith("agw")]
    assert [(r.name, r.levelname, r.exc_info) for r in records] == [("agw.http", "INFO", None)]
    assert records[0].getMessage().startswith("HTTP POST /api/cancel: bad request: invalid JSON")
