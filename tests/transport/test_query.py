"""Query end to end: real gRPC server on loopback, real HTTP client, fake provider."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from agw.v1 import gateway_pb2 as gw
from google.rpc import error_details_pb2, status_pb2

from service.providers.loopback import (
    CLOSE,
    DONE,
    Gate,
    HttpError,
    LoopbackProvider,
    content,
    finish,
    reasoning,
    usage,
)
from service.testing import Harness


def kinds(events: list) -> list[str]:
    return [e.type for e in events]


def assert_envelopes(events: list) -> None:
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    now = time.time() * 1000
    assert all(now - 60_000 < e.timestamp <= now for e in events)
    assert len({e.run_id for e in events}) == 1 and events[0].run_id
    assert len({e.chat_id for e in events}) == 1 and events[0].chat_id
    for e in events:
        assert e.WhichOneof("payload").replace("_", ".", 1) == e.type


def error_info(error: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            info = error_details_pb2.ErrorInfo()
            assert status.details[0].Unpack(info)
            return info
    raise AssertionError("no status details")


async def test_content_only_stream(gateway: Harness, provider: LoopbackProvider) -> None:
    provider.enqueue([content("Hel"), content("lo"), content("!"), finish("stop"), DONE])
    events = await gateway.query("plain", "Hi there", request_id="req-1")
    assert kinds(events) == [
        "request.query",
        "chat.start",
        "run.start",
        "content.start",
        "content.delta",
        "content.delta",
        "content.delta",
        "content.end",
        "run.complete",
    ]
    assert_envelopes(events)
    run_id = events[0].run_id
    query = events[0].request_query
    assert (query.request_id, query.role, query.message, query.agent_key, query.stream) == (
        "req-1",
        "user",
        "Hi there",
        "plain",
        True,
    )
    assert events[1].chat_start.chat_name == "Hi there"
    assert events[2].run_start.agent_key == "plain"
    cid = f"{run_id}_c_1"
    assert events[3].content_start.content_id == cid
    assert [e.content_delta.delta for e in events[4:7]] == ["Hel", "lo", "!"]
    assert {e.content_delta.content_id for e in events[4:7]} == {cid}
    assert events[7].content_end.content_id == cid
    assert events[8].run_complete.finish_reason == "stop"
    sent = provider.requests[0]
    assert sent["stream"] is True
    assert sent["model"] == "fake-model"
    assert sent["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi there"},
    ]


async def test_reasoning_then_content_with_usage(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        [
            reasoning("Let me"),
            reasoning(" think."),
            content("Answer"),
            finish("stop"),
            usage(12, 7, reasoning_tokens=3),
            DONE,
        ]
    )
    events = await gateway.query("thinker", "Why?")
    run_id = events[0].run_id
    assert kinds(events)[3:] == [
        "reasoning.start",
        "reasoning.delta",
        "reasoning.delta",
        "reasoning.end",
        "content.start",
        "content.delta",
        "content.end",
        "run.complete",
    ]
    assert events[3].reasoning_start.reasoning_id == f"{run_id}_r_1"
    assert [e.reasoning_delta.delta for e in events[4:6]] == ["Let me", " think."]
    assert events[7].content_start.content_id == f"{run_id}_c_1"
    done = events[-1].run_complete
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (12, 7)
    assert done.usage.reasoning_tokens == 3


async def test_second_run_of_a_chat_has_no_chat_start(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue([content("one"), finish("stop"), DONE], [content("two"), finish("stop"), DONE])
    first = await gateway.query("plain", "first")
    second = await gateway.query("plain", "second", chat_id=first[0].chat_id)
    assert kinds(second)[:2] == ["request.query", "run.start"]
    assert second[0].chat_id == first[0].chat_id
    assert second[0].run_id != first[0].run_id


async def test_client_chosen_chat_id_starts_a_chat(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue([content("x"), finish("stop"), DONE])
    events = await gateway.query("plain", "hello", chat_id="my-chat")
    assert events[1].type == "chat.start" and events[1].chat_id == "my-chat"


async def test_each_delta_is_sent_before_the_next_arrives(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue([content("first"), Gate(gate), content("second"), finish("stop"), DONE])
    stream = gateway.stub.Query(gw.QueryRequest(agent_key="plain", message="go"))
    received = []
    async for event in stream:
        received.append(event)
        if event.type == "content.delta":
            break
    assert received[-1].content_delta.delta == "first"
    assert not gate.is_set()  # the provider is still holding back the second delta
    gate.set()
    rest = [event async for event in stream]
    assert [e.type for e in rest] == ["content.delta", "content.end", "run.complete"]


async def test_provider_http_error_ends_run_with_run_error(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue([HttpError(500, {"error": {"message": "upstream exploded"}})])
    events = await gateway.query("plain", "hi")
    assert kinds(events) == ["request.query", "chat.start", "run.start", "run.error"]
    error = events[-1].run_error.error
    assert error.reason == "PROVIDER_ERROR"
    assert "fake" in error.message and "500" in error.message
    assert "upstream exploded" in error.message
    assert error.metadata["provider"] == "fake" and error.metadata["status"] == "500"


async def test_stream_cut_mid_answer_closes_blocks_then_errors(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue([reasoning("hmm"), content("partial"), CLOSE])
    events = await gateway.query("thinker", "hi")
    assert kinds(events)[3:] == [
        "reasoning.start",
        "reasoning.delta",
        "reasoning.end",
        "content.start",
        "content.delta",
        "content.end",
        "run.error",
    ]
    assert len(provider.requests) == 1  # never retried after the first byte


async def test_unknown_agent_is_not_found(gateway: Harness) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await gateway.query("nope", "hi")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "nope" in caught.value.details()
    info = error_info(caught.value)
    assert (info.reason, info.domain) == ("AGENT_NOT_FOUND", "agw.v1")


@pytest.mark.parametrize(
    ("fields", "needle"),
    [({"agent_key": "", "message": "hi"}, "agentKey"), ({"agent_key": "plain"}, "message")],
)
async def test_invalid_query_is_invalid_argument(
    gateway: Harness, fields: dict, needle: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        [e async for e in gateway.stub.Query(gw.QueryRequest(**fields))]
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in caught.value.details()


async def test_unconfigured_provider_is_failed_precondition(gateway: Harness, agents_dir) -> None:
    from service.testing import oneshot_agent, write_agent

    write_agent(agents_dir, "elsewhere", oneshot_agent(modelConfig={"providerKey": "bailian"}))
    gateway.app.agents.load_all()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await gateway.query("elsewhere", "hi")
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "bailian" in caught.value.details()


async def test_cancel_rpc_ends_run_with_run_cancel(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue([content("so far"), Gate(gate), content("never"), finish("stop"), DONE])
    stream = gateway.stub.Query(gw.QueryRequest(agent_key="plain", message="go"))
    events = []
    async for event in stream:
        events.append(event)
        if event.type == "content.delta":
            reply = await gateway.stub.Cancel(gw.CancelRequest(run_id=event.run_id))
            assert reply.cancelled
    assert kinds(events)[-3:] == ["content.delta", "content.end", "run.cancel"]
    assert events[-1].run_cancel.reason == "cancel"
    again = await gateway.stub.Cancel(gw.CancelRequest(run_id=events[0].run_id))
    assert not again.cancelled


async def test_cancel_of_unknown_run_is_not_found(gateway: Harness) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await gateway.stub.Cancel(gw.CancelRequest(run_id="missing"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_client_cancel_closes_provider_connection_promptly(
    cancelling_gateway: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue([content("a"), Gate(gate), DONE])
    call = cancelling_gateway.stub.Query(gw.QueryRequest(agent_key="plain", message="go"))
    async for event in call:
        if event.type == "content.delta":
            break
    assert provider.open_connections == 1
    run = cancelling_gateway.app.frontdoor.get_run(event.run_id)
    started = time.monotonic()
    call.cancel()
    await asyncio.wait_for(run.wait(), 1.0)
    await provider.wait_connections(0, timeout=1.0)
    assert time.monotonic() - started < 0.1
    assert run.log[-1].type == "run.cancel"
    assert run.log[-1].run_cancel.reason == "disconnect"


async def test_a_thousand_cancelled_streams_leak_nothing(
    cancelling_gateway: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()  # never set: every stream hangs after its first delta

    def respond(_body: dict) -> list:
        return [content("x"), Gate(gate)]

    provider.responder = respond
    tasks_before = len(asyncio.all_tasks())

    async def one() -> None:
        call = cancelling_gateway.stub.Query(gw.QueryRequest(agent_key="plain", message="go"))
        async for event in call:
            if event.type == "content.delta":
                call.cancel()
                break

    for _ in range(20):
        await asyncio.gather(*(one() for _ in range(50)))
    runtime = cancelling_gateway.app.frontdoor
    await asyncio.wait_for(asyncio.gather(*(run.wait() for run in runtime.runs.values())), 10)
    await provider.wait_connections(0, timeout=10)
    await asyncio.sleep(0)  # let the last tasks' done-callbacks run
    await runtime.flush()  # chat records and run logs written
    assert runtime.active_runs == 0
    assert provider.open_connections == 0
    assert len(asyncio.all_tasks()) <= tasks_before + 2
    assert len(provider.requests) == 1000
    # the pool still works after all that
    provider.responder = None
    provider.enqueue([content("ok"), finish("stop"), DONE])
    events = await cancelling_gateway.query("plain", "still alive?")
    assert events[-1].type == "run.complete"
