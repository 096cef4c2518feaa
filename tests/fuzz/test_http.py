"""Fuzz: every route of the HTTP adapter (from the proto's annotations), the page, junk paths.

One service for the module (see kit.py), with a small body limit and one allowed
CORS origin. Requests of any method, path, query, headers and body (web.py)
must never get a 5xx; every JSON answer is the envelope, every stream is
well-formed SSE keeping the streaming rules, and no file outside the static
directory is served. Raw bytes on the port get a 4xx or nothing. Last, once
every run has ended: nothing leaked, nothing written outside the service's
directories, nothing went wrong unnoticed.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.gateway.routes import Route
from tests.fuzz.guards import assert_no_leaks
from tests.fuzz.http_answers import alive, check, send
from tests.fuzz.http_requests import ROUTES, requests
from tests.fuzz.kit import FuzzService, forget_runs, fuzz, settle

pytestmark = pytest.mark.asyncio(loop_scope="module")

SERVICE_SETTINGS = {"http_max_body_bytes": 64 * 1024, "http_cors_origins": ["http://app.example"]}


@pytest.mark.parametrize("route", [*ROUTES, None], ids=[*(r.template for r in ROUTES), "other"])
@fuzz(40)
@given(data=st.data())
async def test_every_route(service: FuzzService, route: Route | None, data: st.DataObject) -> None:
    request = data.draw(requests(service, route), label="request")
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(
        connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",)
    ) as session:
        answer = await send(service, session, request)
        if answer is None:
            await alive(service, session)
            return
    check(request, answer)


#: Request heads that are not HTTP, or barely.
RAW_HEADS = (
    b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
    b"GET /api/agents HTTP/9.9\r\n\r\n",
    b"POST /api/query HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    b"POST /api/cancel HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST /api/cancel HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n{}",
    b"GET /api/agents HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n",
    b"GET /api/\x00agents HTTP/1.1\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS hello
)


@fuzz(40)
@given(head=st.sampled_from(RAW_HEADS) | st.binary(min_size=1, max_size=200))
async def test_raw_bytes_on_the_port(service: FuzzService, head: bytes) -> None:
    port = service.app.http.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + b"\r\n\r\n")
        await writer.drain()
        async with asyncio.timeout(5):
            answer = await reader.read(200)
    except (ConnectionError, TimeoutError):
        answer = b""
    finally:
        writer.close()
    if answer:
        assert answer.startswith(b"HTTP/1."), answer[:80]
        status = int(answer.split(b" ", 2)[1])
        assert status < 500, answer[:200]


async def test_nothing_leaked_and_nothing_written_outside(service: FuzzService) -> None:
    await settle(service)
    await assert_no_leaks(service)
    service.guard.check()
    await forget_runs(service)
    service.alarms.check()
