"""Failures as HTTP: gRPC status → HTTP status and envelope code, limits, CORS."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import httpx
import httpx_sse
import orjson
import pytest
from agw.v1 import events_pb2 as pb

from service.core.errors import RunNotFound
from service.gateway.server import HttpGateway
from service.gateway.status import HTTP_STATUS
from service.testing import Harness
from service.transport.errors import status_details
from tests.gateway.conftest import Adapter, Script, ScriptedService

FAILURES = [code for code in grpc.StatusCode if code != grpc.StatusCode.OK]


@pytest.mark.parametrize("code", FAILURES, ids=[c.name for c in FAILURES])
async def test_status_codes_map_to_http_and_envelope(
    code: grpc.StatusCode, adapter: Adapter, scripted: ScriptedService
) -> None:
    scripted.scripts["ListAgents"] = Script(code=code, details=f"it went {code.name}")
    response = await adapter.http.get("/api/agents")
    assert response.status_code == HTTP_STATUS[code]
    assert response.json() == {
        "code": code.value[0],
        "msg": f"it went {code.name}",
        "data": None,
        "status": code.name,
    }


def test_the_table_is_grpc_gateways() -> None:
    assert len(HTTP_STATUS) == len(grpc.StatusCode)
    assert HTTP_STATUS[grpc.StatusCode.NOT_FOUND] == 404
    assert HTTP_STATUS[grpc.StatusCode.RESOURCE_EXHAUSTED] == 429
    assert HTTP_STATUS[grpc.StatusCode.UNAVAILABLE] == 503
    assert HTTP_STATUS[grpc.StatusCode.CANCELLED] == 499


async def test_error_info_reason_and_metadata_are_kept(
    adapter: Adapter, scripted: ScriptedService
) -> None:
    error = RunNotFound("no run 'r9'", run_id="r9")
    details = status_details(error, grpc.StatusCode.NOT_FOUND)
    scripted.scripts["Cancel"] = Script(
        code=grpc.StatusCode.NOT_FOUND,
        details=error.message,
        trailing_metadata=(("grpc-status-details-bin", details),),
    )
    response = await adapter.http.post("/api/cancel", json={"runId": "r9"})
    assert response.status_code == 404
    assert response.json() == {
        "code": 5,
        "msg": "no run 'r9'",
        "data": None,
        "status": "NOT_FOUND",
        "reason": "RUN_NOT_FOUND",
        "metadata": {"run_id": "r9"},
    }


async def test_stream_refused_before_its_first_event_is_a_json_error(
    adapter: Adapter, scripted: ScriptedService
) -> None:
    scripted.scripts["Query"] = Script(code=grpc.StatusCode.RESOURCE_EXHAUSTED, details="busy")
    response = await adapter.http.post("/api/query", json={"agentKey": "a", "message": "m"})
    assert response.status_code == 429
    assert response.headers["Content-Type"].startswith("application/json")
    assert response.json()["code"] == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]


@pytest.mark.parametrize(
    ("headers_first", "delay_s"),
    [(False, 1.0), (True, 0.05)],
    ids=["status after a second", "status right behind the headers"],
)
async def test_stream_refused_late_is_still_a_json_error(
    headers_first: bool, delay_s: float, adapter: Adapter, scripted: ScriptedService
) -> None:
    # A loaded service refuses slowly; its headers may also come in before its status.
    scripted.scripts["Query"] = Script(
        code=grpc.StatusCode.RESOURCE_EXHAUSTED,
        details="busy",
        headers_first=headers_first,
        delay_s=delay_s,
    )
    response = await adapter.http.post("/api/query", json={"agentKey": "a", "message": "m"})
    assert response.status_code == 429
    assert response.headers["Content-Type"].startswith("application/json")
    assert response.json() == {
        "code": 8,
        "msg": "busy",
        "data": None,
        "status": "RESOURCE_EXHAUSTED",
    }


async def test_a_silent_stream_is_opened_by_a_heartbeat(scripted: ScriptedService) -> None:
    first = pb.Event(seq=1, type="run.start", run_start=pb.RunStart(agent_key="a"))
    scripted.scripts["Attach"] = Script(messages=[first], delay_s=0.6)
    gateway = HttpGateway(scripted.target, heartbeat_s=0.2)
    await gateway.start("127.0.0.1:0")
    try:
        async with (
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}") as http,
            http.stream("GET", "/api/runs/r1/events") as response,
        ):
            assert response.status_code == 200
            lines = [line async for line in response.aiter_lines()]
    finally:
        await gateway.stop()
    assert lines[:2] == [": heartbeat", ""]
    assert lines[-3:] == ["id: 1", 'data: {"seq":1,"type":"run.start","agentKey":"a"}', ""]


async def test_stream_failing_midway_ends_with_an_error_message(
    adapter: Adapter, scripted: ScriptedService
) -> None:
    first = pb.Event(seq=1, type="run.start", run_start=pb.RunStart(agent_key="a"))
    scripted.scripts["Query"] = Script(
        messages=[first], code=grpc.StatusCode.UNAVAILABLE, details="shutting down"
    )
    body = {"agentKey": "a", "message": "m"}
    async with httpx_sse.aconnect_sse(adapter.http, "POST", "/api/query", json=body) as source:
        messages = [(sse.event, sse.id, orjson.loads(sse.data)) async for sse in source.aiter_sse()]
    assert messages == [
        ("message", "1", {"seq": 1, "type": "run.start", "agentKey": "a"}),
        (
            "error",
            "1",  # SSE keeps the last event id: the error carries no id of its own
            {"code": 14, "msg": "shutting down", "data": None, "status": "UNAVAILABLE"},
        ),
    ]


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/api/nope", 404, 5),
        ("DELETE", "/api/agents", 405, 12),
        ("GET", "/api/query", 405, 12),
    ],
)
async def test_no_route_and_wrong_method(
    method: str, path: str, status: int, code: int, adapter: Adapter
) -> None:
    response = await adapter.http.request(method, path)
    assert response.status_code == status
    body = response.json()
    assert (body["code"], body["data"]) == (code, None)
    assert path in body["msg"]


async def test_body_over_the_limit_is_refused(adapter: Adapter, scripted: ScriptedService) -> None:
    big = {"name": "a.bin", "content": "A" * (adapter.gateway.max_body_bytes + 1)}
    response = await adapter.http.post("/api/upload", json=big)
    assert response.status_code == 413
    body = response.json()
    assert (body["code"], body["status"]) == (8, "RESOURCE_EXHAUSTED")
    assert scripted.requests == []


async def test_unreachable_service_is_unavailable(unused_tcp_port: int) -> None:
    gateway = HttpGateway(f"127.0.0.1:{unused_tcp_port}")
    await gateway.start("127.0.0.1:0")
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}") as http:
            response = await http.get("/api/agents")
            streamed = await http.post("/api/query", json={"agentKey": "a", "message": "m"})
    finally:
        await gateway.stop()
    assert response.status_code == 503 and response.json()["status"] == "UNAVAILABLE"
    assert streamed.status_code == 503 and streamed.json()["code"] == 14


async def test_real_service_errors_keep_their_reason(
    gateway: Harness, http: httpx.AsyncClient
) -> None:
    unknown = await http.post("/api/query", json={"agentKey": "nope", "message": "hi"})
    assert unknown.status_code == 404
    assert (unknown.json()["code"], unknown.json()["reason"]) == (5, "AGENT_NOT_FOUND")
    invalid = await http.post("/api/query", json={"agentKey": "plain"})
    assert invalid.status_code == 400
    assert invalid.json()["code"] == 3 and "message" in invalid.json()["msg"]
    missing = await http.get("/api/runs/missing/events")
    assert (missing.status_code, missing.json()["reason"]) == (404, "RUN_NOT_FOUND")


# CORS --------------------------------------------------------------------------------


@pytest.fixture
async def cors(scripted: ScriptedService) -> AsyncIterator[httpx.AsyncClient]:
    gateway = HttpGateway(scripted.target, cors_origins=["https://app.example"])
    await gateway.start("127.0.0.1:0")
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}") as http:
            yield http
    finally:
        await gateway.stop()


async def test_cors_preflight_of_an_allowed_origin(cors: httpx.AsyncClient) -> None:
    response = await cors.options(
        "/api/query",
        headers={
            "Origin": "https://app.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, last-event-id",
        },
    )
    assert response.status_code == 204
    assert response.headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert "POST" in response.headers["Access-Control-Allow-Methods"]
    assert response.headers["Access-Control-Allow-Headers"] == "content-type, last-event-id"


async def test_cors_refuses_other_origins(cors: httpx.AsyncClient) -> None:
    preflight = await cors.options(
        "/api/agents",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"},
    )
    assert preflight.status_code == 403 and preflight.json()["code"] == 7
    plain = await cors.get("/api/agents", headers={"Origin": "https://evil.example"})
    assert "Access-Control-Allow-Origin" not in plain.headers


async def test_cors_headers_on_unary_and_streamed_answers(
    cors: httpx.AsyncClient, scripted: ScriptedService
) -> None:
    origin = {"Origin": "https://app.example"}
    unary = await cors.get("/api/agents", headers=origin)
    assert unary.headers["Access-Control-Allow-Origin"] == "https://app.example"
    scripted.scripts["Attach"] = Script(messages=[pb.Event(seq=1, type="run.start")])
    async with cors.stream("GET", "/api/runs/r1/events", headers=origin) as streamed:
        assert streamed.headers["Access-Control-Allow-Origin"] == "https://app.example"
        assert streamed.headers["Content-Type"].startswith("text/event-stream")


async def test_no_cors_headers_without_configured_origins(adapter: Adapter) -> None:
    response = await adapter.http.get("/api/agents", headers={"Origin": "https://app.example"})
    assert "Access-Control-Allow-Origin" not in response.headers
