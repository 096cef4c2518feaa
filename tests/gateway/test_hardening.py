"""The adapter's defences against bad input: headers, bounded echoes, quiet logs.

Through real HTTP in front of the scripted gRPC service, which records what
reaches it.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import Adapter, ScriptedService


def refused(response: httpx.Response, status: int, code: int, needle: str) -> None:
    """`response` is the error envelope with this status and code, naming `needle`."""
    assert response.status_code == status
    assert response.headers["Content-Type"].startswith("application/json")
    body = response.json()
    assert (body["code"], body["data"]) == (code, None)
    assert needle in body["msg"]


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
        ("GET", "/api/runs/r1/events", {"headers": {"Last-Event-ID": LONG}}),
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
