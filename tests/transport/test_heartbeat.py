"""Heartbeats of the gRPC streams: seq 0 keep-alives on silences, never part of the run's log."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw

from service.providers.loopback import LoopbackProvider
from tests.core.tools.kit import answer_turn, assert_invariants, call_turn, kinds, tool_gateway
from tests.transport.test_logging import calls, until_logged
from tests.transport.test_orchestration import recorded
from tests.transport.test_submit_cancel import AGENTS, submit

HEAD = ["request.query", "chat.start", "run.start"]
PICK = ["tool.start", "tool.args", "tool.args", "tool.end"]
AFTER = ["request.submit", "tool.result", "content.start", "content.delta", "content.end"]
BEAT_S = 0.05


async def read_until(call: Any, events: list[pb.Event], done: Any) -> None:
    """Read `call` into `events` until `done(events)` holds."""
    async for event in call:
        events.append(event)
        if done(events):
            return
    raise AssertionError(f"the stream ended first: {kinds(events)}")


def beats(events: list[pb.Event]) -> list[pb.Event]:
    return [e for e in events if e.type == "heartbeat"]


def run_events(events: list[pb.Event]) -> list[pb.Event]:
    return [e for e in events if e.type != "heartbeat"]


async def test_a_stream_waiting_for_submit_sends_heartbeats(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(call_turn(("call_f", "pick", '{"options":["a"]}')), answer_turn("a it is"))
    async with tool_gateway(tmp_path, provider, AGENTS, grpc_heartbeat_s=BEAT_S) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="ui", message="Choose"))
        events: list[pb.Event] = []
        await read_until(call, events, lambda seen: seen[-1].type == "tool.end")
        waiting = len(events)
        await read_until(call, events, lambda seen: len(beats(seen[waiting:])) >= 2)
        # Attach at the live end hears the same silence: heartbeats, then the rest of the run.
        last = run_events(events)[-1].seq
        attach = gateway.stub.Attach(gw.AttachRequest(run_id=events[0].run_id, after_seq=last))
        attached: list[pb.Event] = []
        await read_until(attach, attached, lambda seen: len(beats(seen)) >= 1)
        tool_id = events[waiting - 1].tool_end.tool_id
        assert (await submit(gateway, events[0].run_id, tool_id, "a")).accepted
        events += [e async for e in call]
        attached += [e async for e in attach]
        await recorded(gateway, events)
        chat = await gateway.stub.GetChat(gw.GetChatRequest(chat_id=events[0].chat_id))
        replayed = [e async for e in gateway.stub.Attach(gw.AttachRequest(run_id=events[0].run_id))]
    live = run_events(events)
    assert kinds(live) == [*HEAD, *PICK, *AFTER, "run.complete"]
    assert_invariants(live)
    waits = [e for e in events[waiting:] if e.type != "heartbeat"]
    assert waits[0].type == "request.submit"  # the beats came while the run waited
    for beat in beats(events) + beats(attached):
        assert (beat.seq, beat.run_id, beat.chat_id) == (0, live[0].run_id, live[0].chat_id)
        assert beat.WhichOneof("payload") == "heartbeat" and beat.timestamp > 0
    assert run_events(attached) == live[last:]
    assert replayed == live  # the log holds no heartbeat
    assert "heartbeat" not in kinds(list(chat.events))


async def test_heartbeats_can_be_switched_off(tmp_path: Path, provider: LoopbackProvider) -> None:
    provider.enqueue(call_turn(("call_f", "pick", '{"options":["a"]}')), answer_turn("a"))
    async with tool_gateway(tmp_path, provider, AGENTS, grpc_heartbeat_s=0) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="ui", message="Choose"))
        events: list[pb.Event] = []
        await read_until(call, events, lambda seen: seen[-1].type == "tool.end")
        await asyncio.sleep(0.3)
        tool_id = events[-1].tool_end.tool_id
        assert (await submit(gateway, events[0].run_id, tool_id, "a")).accepted
        events += [e async for e in call]
    assert kinds(events) == [*HEAD, *PICK, *AFTER, "run.complete"]


async def test_heartbeats_count_among_the_events_a_call_logs(
    tmp_path: Path, provider: LoopbackProvider, caplog: pytest.LogCaptureFixture
) -> None:
    """A heartbeat is sent by the shared timer's task, in the call's own context: the call's
    log line counts it, as every message the call sent."""
    caplog.set_level(logging.INFO, logger="agw")
    provider.enqueue(call_turn(("call_f", "pick", '{"options":["a"]}')), answer_turn("a"))
    async with tool_gateway(tmp_path, provider, AGENTS, grpc_heartbeat_s=BEAT_S) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="ui", message="Choose"))
        events: list[pb.Event] = []
        await read_until(call, events, lambda seen: len(beats(seen)) >= 2)
        tool_id = next(e.tool_end.tool_id for e in events if e.type == "tool.end")
        assert (await submit(gateway, events[0].run_id, tool_id, "a")).accepted
        events += [e async for e in call]
        await until_logged(caplog, 2)  # Submit's line, then Query's
    (line,) = [r for r in calls(caplog) if r.method == "Query"]
    assert line.events == len(events) and len(beats(events)) >= 2
