"""Three replicas on one Redis: any of them serves Query, Attach, Submit, Cancel, GetChat."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from agw.v1 import gateway_pb2 as gw
from google.protobuf import json_format, struct_pb2

from service.providers.loopback import DONE, Gate, LoopbackProvider, content, finish
from tests.bus.conftest import rest, started, until
from tests.core.tools.kit import answer_turn, call_turn, kinds, result_of
from tests.transport.test_query import error_info

HEAD = ["request.query", "chat.start", "run.start"]
ANSWER = ["content.start", "content.delta", "content.end", "run.complete"]


def value(data: Any) -> struct_pb2.Value:
    out = struct_pb2.Value()
    json_format.ParseDict(data, out)
    return out


def gated(*pieces: str) -> tuple[list[Any], list[asyncio.Event]]:
    """A script streaming `pieces`, each but the first behind a gate of its own."""
    gates = [asyncio.Event() for _ in pieces[1:]]
    script: list[Any] = [content(pieces[0])]
    for gate, piece in zip(gates, pieces[1:], strict=True):
        script += [Gate(gate), content(piece)]
    return [*script, finish("stop"), DONE], gates


async def test_attach_on_b_at_every_seq_of_a_run_on_a_has_no_gap_or_duplicate(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    script, gates = gated("w0 ", "w1 ", "w2 ", "w3")
    provider.enqueue(script)
    async with started(tmp_path, provider, redis_url) as replicas:
        a, b, c = replicas["A"], replicas["B"], replicas["C"]
        call = a.query("plain", "go")
        followers: list[asyncio.Task[list[Any]]] = []
        seen = []
        released = 0
        async for event in call:
            seen.append(event)
            if not followers:  # the first follower starts before anything was published
                followers.append(asyncio.create_task(b.attach(event.run_id, 0)))
            followers.append(asyncio.create_task(b.attach(event.run_id, event.seq)))
            if event.type == "content.delta" and released < len(gates):
                gates[released].set()
                released += 1
        run_id = seen[0].run_id
        assert b.bus.local(run_id) is None  # B reads the run from Redis
        assert await followers[0] == seen
        for follower, event in zip(followers[1:], seen, strict=True):
            assert await follower == seen[event.seq :]
        for after in range(len(seen) + 1):  # and once it ended, from the stream
            assert await c.attach(run_id, after) == seen[after:]
    assert kinds(seen) == [*HEAD, "content.start", *["content.delta"] * 4, *ANSWER[2:]]
    assert [e.seq for e in seen] == list(range(1, len(seen) + 1))


async def test_submit_via_c_reaches_the_frontend_tool_waiting_on_a(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    provider.enqueue(call_turn(("call_f", "pick", '{"options":["a","b"]}')), answer_turn("a"))
    async with started(tmp_path, provider, redis_url) as replicas:
        a, c = replicas["A"], replicas["C"]
        call = a.query("ui", "Choose")
        events: list[Any] = []
        end = await until(call, "tool.end", events)
        run_id, chat_id, tool_id = end.run_id, end.chat_id, end.tool_end.tool_id
        assert a.bus.waits.waiting(run_id) == [tool_id] and c.bus.waits.waiting(run_id) == []

        async def submit(tool: str, payload: Any, **extra: Any) -> Any:
            request = gw.SubmitRequest(run_id=run_id, tool_id=tool, payload=value(payload), **extra)
            return await c.stub.Submit(request)

        unknown_tool = await submit("t_00000000", 1)
        other_chat = await submit(tool_id, 1, chat_id="other")
        accepted = await submit(tool_id, {"choice": "a"}, request_id="req-9", view_id="v1")
        events += await rest(call)
        again = await submit(tool_id, {"choice": "b"})
        unknown_run = await c.stub.Submit(
            gw.SubmitRequest(run_id="0123456789abcdef", tool_id=tool_id, payload=value(1))
        )
    assert kinds(events) == [
        *HEAD,
        *["tool.start", "tool.args", "tool.args", "tool.end"],
        "request.submit",
        "tool.result",
        *ANSWER,
    ]
    submitted = events[7].request_submit
    assert (submitted.request_id, submitted.tool_id, submitted.view_id) == ("req-9", tool_id, "v1")
    assert result_of(events[8]) == {"choice": "a"}
    assert provider.requests[1]["messages"][-1]["content"] == json.dumps({"choice": "a"})
    assert (accepted.accepted, accepted.outcome) == (True, gw.SUBMIT_OUTCOME_ACCEPTED)
    assert accepted.detail == f"tool {tool_id!r} (pick) took the payload"
    assert unknown_tool.outcome == gw.SUBMIT_OUTCOME_UNKNOWN_TOOL
    assert unknown_tool.detail == f"run {run_id} has no tool 't_00000000' (waiting: {tool_id})"
    assert other_chat.outcome == gw.SUBMIT_OUTCOME_UNKNOWN_RUN
    assert again.outcome == gw.SUBMIT_OUTCOME_ALREADY_ANSWERED
    assert unknown_run.outcome == gw.SUBMIT_OUTCOME_UNKNOWN_RUN
    assert chat_id


async def test_cancel_via_b_stops_the_run_on_a(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    script, _gates = gated("so far", "never")
    provider.enqueue(script)
    async with started(tmp_path, provider, redis_url) as replicas:
        a, b = replicas["A"], replicas["B"]
        call = a.query("plain", "go")
        events: list[Any] = []
        delta = await until(call, "content.delta", events)
        early = b.stub.Attach(gw.AttachRequest(run_id=delta.run_id))
        left = await until(early, "run.start", [])
        early.cancel()  # a follower on B going away leaves the others be
        following = asyncio.create_task(b.attach(delta.run_id, 0))
        cancelled = await b.stub.Cancel(gw.CancelRequest(run_id=delta.run_id))
        events += await rest(call)
        followed = await following
        again = await b.stub.Cancel(gw.CancelRequest(run_id=delta.run_id))
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await b.stub.Cancel(gw.CancelRequest(run_id="0123456789abcdef"))
    assert (cancelled.cancelled, cancelled.detail) == (True, "cancelling")
    assert (again.cancelled, again.detail) == (False, "the run had already ended")
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert kinds(events) == [*HEAD, "content.start", "content.delta", "content.end", "run.cancel"]
    assert events[-1].run_cancel.reason == "cancel"
    assert followed == events and left == events[2]


async def test_a_busy_chat_is_busy_on_every_replica_and_a_query_enqueued_elsewhere_waits(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    first, (gate,) = gated("one ", "two")
    provider.enqueue(first, answer_turn("three"))
    async with started(tmp_path, provider, redis_url) as replicas:
        a, b, c = replicas["A"], replicas["B"], replicas["C"]
        call = a.query("plain", "first")
        on_a: list[Any] = []
        delta = await until(call, "content.delta", on_a)
        chat_id = delta.chat_id
        with pytest.raises(grpc.aio.AioRpcError) as busy:
            await b.ask("plain", "again", chat_id=chat_id)
        enqueue = gw.MULTITASK_STRATEGY_ENQUEUE
        queued = asyncio.create_task(
            c.ask("plain", "queued", chat_id=chat_id, multitask_strategy=enqueue)
        )
        await asyncio.sleep(0.2)
        assert not queued.done()  # it waits for the run on A
        gate.set()
        on_a += await rest(call)
        on_c = await queued
    assert busy.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    info = error_info(busy.value)
    assert (info.reason, dict(info.metadata)) == (
        "CHAT_BUSY",
        {"chat_id": chat_id, "run_id": delta.run_id},
    )
    assert kinds(on_a) == [*HEAD, "content.start", "content.delta", "content.delta", *ANSWER[2:]]
    assert kinds(on_c) == ["request.query", "run.start", *ANSWER]
    assert on_c[0].chat_id == chat_id and on_c[0].run_id != delta.run_id
    assert provider.requests[1]["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "one two"},
        {"role": "user", "content": "queued"},
    ]


async def test_a_query_interrupting_a_run_of_another_replica_cancels_it_first(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    first, _gates = gated("so far", "never")
    provider.enqueue(first, answer_turn("fresh"))
    async with started(tmp_path, provider, redis_url) as replicas:
        a, b = replicas["A"], replicas["B"]
        call = a.query("plain", "first")
        on_a: list[Any] = []
        delta = await until(call, "content.delta", on_a)
        interrupt = gw.MULTITASK_STRATEGY_INTERRUPT
        on_b = await b.ask("plain", "second", chat_id=delta.chat_id, multitask_strategy=interrupt)
        on_a += await rest(call)
    assert kinds(on_a) == [*HEAD, "content.start", "content.delta", "content.end", "run.cancel"]
    assert on_a[-1].run_cancel.reason == "interrupt"
    assert kinds(on_b) == ["request.query", "run.start", *ANSWER]
    assert provider.requests[1]["messages"] == [  # the interrupted run's part is remembered
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "so far"},
        {"role": "user", "content": "second"},
    ]


async def test_a_chat_continued_on_another_replica_keeps_its_history(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    provider.enqueue(answer_turn("Nice to meet you, Ada."), answer_turn("Ada."))
    async with started(tmp_path, provider, redis_url) as replicas:
        a, b, c = replicas["A"], replicas["B"], replicas["C"]
        first = await a.ask("plain", "I am Ada.")
        chat_id = first[0].chat_id
        second = await b.ask("plain", "Who am I?", chat_id=chat_id)
        chat = await c.stub.GetChat(gw.GetChatRequest(chat_id=chat_id))
        listed = await c.stub.ListChats(gw.ListChatsRequest())
    assert provider.requests[1]["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "I am Ada."},
        {"role": "assistant", "content": "Nice to meet you, Ada."},
        {"role": "user", "content": "Who am I?"},
    ]
    assert kinds(first) == [*HEAD, *ANSWER]
    assert kinds(second) == ["request.query", "run.start", *ANSWER]
    snapshot = ["run.start", "content.snapshot", "run.complete"]
    assert kinds(chat.events) == [
        "request.query",
        "chat.start",
        *snapshot,
        "request.query",
        *snapshot,
    ]
    assert [e.run_id for e in chat.events if e.type == "run.start"] == [
        first[0].run_id,
        second[0].run_id,
    ]
    assert chat.chat_name == "I am Ada."
    assert [(s.chat_id, s.run_count) for s in listed.chats] == [(chat_id, 2)]


async def test_the_owner_serves_its_run_from_redis_once_it_let_it_go(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    provider.enqueue(answer_turn("Hi."))
    async with started(tmp_path, provider, redis_url, ("A", "B"), retention_s=0.05) as replicas:
        a = replicas["A"]
        live = await a.ask("plain", "hello")
        run_id = live[0].run_id
        await a.front.flush()
        await asyncio.sleep(0.1)
        await a.front.flush()  # the release after the retention
        assert a.bus.local(run_id) is None
        again = [await a.attach(run_id, after) for after in range(len(live) + 1)]
        kept = await replicas.run_log.load(run_id)
    assert again == [live[after:] for after in range(len(live) + 1)]
    assert kept == live
