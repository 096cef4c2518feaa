"""The message size limit, through gRPC and through the HTTP adapter, on the real service."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest
from agw.v1 import gateway_pb2 as gw

from service.assembly.config import Settings
from service.providers.loopback import DONE, LoopbackProvider, content, finish
from service.testing import Harness
from tests.transport.test_query import error_info

MIB = 1024 * 1024


@pytest.fixture
async def small(agents_dir: Path, provider: LoopbackProvider) -> AsyncIterator[Harness]:
    """The service with a 64-byte message limit."""
    async with Harness.start(agents_dir, provider, max_message_bytes=64) as harness:
        yield harness


async def test_a_five_megabyte_message_is_refused_over_grpc(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await gateway.query("plain", "x" * (5 * MIB))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert caught.value.details() == "message is 5242880 bytes; the limit is 1048576 bytes"
    assert error_info(caught.value).reason == "PAYLOAD_TOO_LARGE"
    assert gateway.app.frontdoor.runs == {} and provider.requests == []


async def test_the_default_limit_is_one_mebibyte(gateway: Harness) -> None:
    assert Settings.model_fields["max_message_bytes"].default == MIB
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await gateway.query("plain", "x" * (MIB + 1))
    assert caught.value.details() == "message is 1048577 bytes; the limit is 1048576 bytes"


async def test_the_limit_counts_utf8_bytes(small: Harness, provider: LoopbackProvider) -> None:
    provider.enqueue([content("ok"), finish("stop"), DONE])
    events = await small.query("plain", "é" * 32)  # 64 bytes
    assert [events[0].type, events[-1].type] == ["request.query", "run.complete"]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await small.query("plain", "é" * 32 + "!")  # 33 characters, 65 bytes
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert caught.value.details() == "message is 65 bytes; the limit is 64 bytes"
    assert len(provider.requests) == 1


async def test_a_five_megabyte_message_is_refused_over_http(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    async with httpx.AsyncClient(base_url=gateway.http_url, timeout=30) as http:
        response = await http.post(
            "/api/query", json={"agentKey": "plain", "message": "x" * (5 * MIB)}
        )
    assert response.status_code == 429
    assert response.json() == {
        "code": 8,
        "msg": "message is 5242880 bytes; the limit is 1048576 bytes",
        "data": None,
        "status": "RESOURCE_EXHAUSTED",
        "reason": "PAYLOAD_TOO_LARGE",
    }
    assert gateway.app.frontdoor.runs == {} and provider.requests == []


async def test_a_configured_limit_holds_on_both_transports(
    small: Harness, provider: LoopbackProvider
) -> None:
    async with httpx.AsyncClient(base_url=small.http_url, timeout=30) as http:
        response = await http.post("/api/query", json={"agentKey": "plain", "message": "y" * 65})
    assert response.status_code == 429
    assert response.json()["msg"] == "message is 65 bytes; the limit is 64 bytes"
    request = gw.QueryRequest(agent_key="plain", message="y" * 65)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        [event async for event in small.stub.Query(request)]
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert small.app.frontdoor.active_runs == 0
