"""Admission and bad input at the door: nothing leaks, refusals are fast and precise."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from agw.v1 import gateway_pb2 as gw
from google.protobuf import struct_pb2

from service.providers.loopback import DONE, Gate, LoopbackProvider, content, finish
from service.testing import Harness
from tests.core.tools.kit import agent, answer_turn, tool_gateway
from tests.transport.test_query import error_info

AGENTS = {"plain": agent()}


async def drain(call: Any) -> list[Any]:
    return [event async for event in call]


async def status_of(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await drain(call)
    return caught.value


def params_with(value: float) -> struct_pb2.Struct:
    params = struct_pb2.Struct()
    params.fields["x"].number_value = value
    return params


@pytest.fixture
async def small(tmp_path: Path, provider: LoopbackProvider) -> AsyncIterator[Harness]:
    async with tool_gateway(tmp_path, provider, AGENTS, max_concurrent_runs=2) as gateway:
        yield gateway


async def test_requests_that_json_cannot_carry_leak_no_run_slot(
    small: Harness, provider: LoopbackProvider
) -> None:
    for n in range(1000):
        value = (math.inf, -math.inf, math.nan)[n % 3]
        request = gw.QueryRequest(agent_key="plain", message="hi", params=params_with(value))
        if n % 2:
            request = gw.QueryRequest(agent_key="plain", message="hi", scene=params_with(value))
        error = await status_of(small.stub.Query(request))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(error).reason == "INVALID_REQUEST"
    assert small.app.frontdoor.active_runs == 0 and not small.app.frontdoor.runs
    provider.enqueue(answer_turn("one"), answer_turn("two"))
    first, second = await asyncio.gather(
        drain(small.stub.Query(gw.QueryRequest(agent_key="plain", message="a"))),
        drain(small.stub.Query(gw.QueryRequest(agent_key="plain", message="b"))),
    )
    assert first[-1].type == second[-1].type == "run.complete"


async def test_a_full_gateway_refuses_at_once_and_says_how_many_fit(
    small: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    held = []
    for _ in range(2):
        provider.enqueue([content("holding"), Gate(gate), finish("stop"), DONE])
        call = small.stub.Query(gw.QueryRequest(agent_key="plain", message="hold"))
        async for event in call:
            if event.type == "content.delta":
                break
        held.append(call)
    started = time.monotonic()
    error = await status_of(small.stub.Query(gw.QueryRequest(agent_key="plain", message="more")))
    assert time.monotonic() - started < 1.0
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_info(error).reason == "OVERLOADED"
    assert "2 of the 2 that fit" in error.details()
    assert error_info(error).metadata["limit"] == "2"
    gate.set()
    for call in held:
        assert (await drain(call))[-1].type == "run.complete"


async def test_calls_past_the_rpc_limit_are_refused_not_queued(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    settings = {"max_concurrent_runs": 10, "max_concurrent_rpcs": 3}
    async with tool_gateway(tmp_path, provider, AGENTS, **settings) as gateway:
        gate = asyncio.Event()
        held = []
        for _ in range(3):
            provider.enqueue([content("holding"), Gate(gate), finish("stop"), DONE])
            call = gateway.stub.Query(gw.QueryRequest(agent_key="plain", message="hold"))
            async for event in call:
                if event.type == "content.delta":
                    break
            held.append(call)
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await gateway.stub.ListAgents(gw.ListAgentsRequest(), timeout=10)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert time.monotonic() - started < 2.0
        gate.set()
        for call in held:
            assert (await drain(call))[-1].type == "run.complete"
        agents = await gateway.stub.ListAgents(gw.ListAgentsRequest())
        assert [a.key for a in agents.agents] == ["plain"]


async def test_undecodable_requests_are_invalid_arguments_logged_in_one_line(
    small: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    channel = small.channel
    garbage = b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"  # a length past the end
    with caplog.at_level(logging.WARNING):
        for method, streaming in [
            ("ListChats", False),
            ("Submit", False),
            ("Query", True),
            ("Attach", True),
        ]:
            path = f"/agw.v1.AgentGateway/{method}"
            if streaming:
                call = channel.unary_stream(path)(garbage)
                error = await status_of(call)
            else:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await channel.unary_unary(path)(garbage)
                error = caught.value
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, method
            assert error.details() == f"the request is not a valid {method} request"
    records = [r for r in caplog.records if "undecodable" in r.getMessage()]
    assert len(records) == 4 and all(r.exc_info is None for r in records)
    assert small.app.frontdoor.active_runs == 0


async def test_huge_ids_are_not_echoed_into_statuses(small: Harness) -> None:
    huge = "r" * 6000
    for call in [
        lambda: small.stub.Attach(gw.AttachRequest(run_id=huge)),
        lambda: small.stub.Cancel(gw.CancelRequest(run_id=huge)),
        lambda: small.stub.GetChat(gw.GetChatRequest(chat_id=huge)),
        lambda: small.stub.Query(gw.QueryRequest(agent_key=huge, message="x")),
        lambda: small.stub.Query(gw.QueryRequest(agent_key="plain", message="x", chat_id=huge)),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            result = call()
            if hasattr(result, "__aiter__"):
                await drain(result)
            else:
                await result
        error = caught.value
        assert error.code() in {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT}
        assert len(error.details()) < 1200
        assert all(len(v) <= 300 for v in error_info(error).metadata.values())


@pytest.mark.parametrize("piece", ["🙂", "é", "\x07"])
async def test_non_ascii_ids_are_echoed_cut_short(small: Harness, piece: str) -> None:
    """Percent-encoded on the wire, 1,024 emoji in a status took 12 KiB of trailers, past
    what a client accepts: the call failed RESOURCE_EXHAUSTED instead of NOT_FOUND."""
    key = piece * 3000
    shown = piece * 64 + "…"
    for call in [
        lambda: small.stub.GetAgent(gw.GetAgentRequest(agent_key=key)),
        lambda: drain(small.stub.Query(gw.QueryRequest(agent_key=key, message="x"))),
    ]:
        for _ in range(5):  # past 8 KiB of trailers, gRPC refuses some statuses at random
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call()
            error = caught.value
            assert error.code() == grpc.StatusCode.NOT_FOUND, error.details()[:200]
            assert error.details() == f"unknown agent {shown!r}; available agents: plain"
            assert error_info(error).metadata == {"agent_key": shown}


async def test_chat_ids_with_a_trailing_newline_are_refused(small: Harness) -> None:
    error = await status_of(
        small.stub.Query(gw.QueryRequest(agent_key="plain", message="x", chat_id="abc\n"))
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "invalid chatId" in error.details()
