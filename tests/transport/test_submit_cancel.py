"""Submit (frontend tools), actions and Cancel, end to end over gRPC with the fake provider."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from agw.v1 import gateway_pb2 as gw
from google.protobuf import json_format, struct_pb2

from service.providers import loopback as lb
from service.providers.loopback import LoopbackProvider
from service.testing import Harness
from tests.core.tools.kit import (
    ID_FORMS,
    Probe,
    agent,
    answer_turn,
    assert_invariants,
    call_turn,
    kinds,
    result_of,
    tool_gateway,
    tools,
)
from tests.transport.test_query import error_info

HEAD = ["request.query", "chat.start", "run.start"]
CALL = ["tool.start", "tool.args", "tool.args", "tool.end"]
ANSWER = ["content.start", "content.delta", "content.end", "run.complete"]
AGENTS = {
    "ui": agent(toolConfig=tools(frontends=("pick",), actions=("theme",))),
    "slow": agent(toolConfig=tools("forever")),
    "plain": agent(),
}


def value(data: Any) -> struct_pb2.Value:
    out = struct_pb2.Value()
    json_format.ParseDict(data, out)
    return out


async def submit(gateway: Harness, run_id: str, tool_id: str, payload: Any, **extra: Any) -> Any:
    request = gw.SubmitRequest(run_id=run_id, tool_id=tool_id, payload=value(payload), **extra)
    return await gateway.stub.Submit(request)


async def until(call: Any, kind: str, events: list) -> Any:
    """Read `call` into `events` up to the first event of type `kind`."""
    async for event in call:
        events.append(event)
        if event.type == kind:
            return event
    raise AssertionError(f"no {kind} in {kinds(events)}")


async def test_a_frontend_tool_waits_for_submit(tmp_path: Path, provider: LoopbackProvider) -> None:
    provider.enqueue(call_turn(("call_f", "pick", '{"options":["a","b"]}')), answer_turn("a it is"))
    async with tool_gateway(tmp_path, provider, AGENTS) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="ui", message="Choose"))
        events: list = []
        end = await until(call, "tool.end", events)
        tool_id, run_id = end.tool_end.tool_id, end.run_id
        assert ID_FORMS["frontend"].match(tool_id)
        start = events[3].tool_start
        assert (start.tool_id, start.tool_name, start.tool_type) == (tool_id, "pick", "html")
        assert (start.tool_api, start.description) == (
            "/views/pick.html",
            "Let the user pick an option.",
        )
        assert json_format.MessageToDict(start.tool_params) == {"size": "small"}
        run = gateway.app.frontdoor.get_run(run_id)
        assert not run.done and gateway.app.bus.waits.waiting(run_id) == [tool_id]

        reply = await submit(
            gateway, run_id, tool_id, {"choice": "a"}, request_id="req-9", view_id="v1"
        )
        assert (reply.accepted, reply.outcome) == (True, gw.SUBMIT_OUTCOME_ACCEPTED)
        events += [event async for event in call]
        again = await submit(gateway, run_id, tool_id, {"choice": "b"})
    assert kinds(events) == HEAD + CALL + ["request.submit", "tool.result"] + ANSWER
    assert_invariants(events)
    submitted = events[7].request_submit
    assert (submitted.request_id, submitted.tool_id, submitted.view_id) == ("req-9", tool_id, "v1")
    assert json_format.MessageToDict(submitted.payload) == {"choice": "a"}
    assert events[8].tool_result.tool_id == tool_id and result_of(events[8]) == {"choice": "a"}
    assert provider.requests[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_f",
        "name": "pick",
        "content": json.dumps({"choice": "a"}),
    }
    assert (again.accepted, again.outcome) == (False, gw.SUBMIT_OUTCOME_ALREADY_ANSWERED)


async def test_a_frontend_wait_times_out_and_the_run_goes_on(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(call_turn(("call_f", "pick", "{}")), answer_turn("No answer"))
    async with tool_gateway(tmp_path, provider, AGENTS, frontend_wait_timeout_s=0.2) as gateway:
        events = await gateway.query("ui", "Choose")
        late = await submit(gateway, events[0].run_id, events[3].tool_start.tool_id, "a")
    assert kinds(events) == HEAD + CALL + ["tool.result"] + ANSWER
    result = events[7].tool_result
    assert result.error
    assert result_of(events[7]) == "Error: the user did not answer 'pick' within 0.2 s"
    assert (late.accepted, late.outcome) == (False, gw.SUBMIT_OUTCOME_EXPIRED)
    assert "timed out" in late.detail


async def test_a_run_waiting_for_submit_outlives_its_unwatched_ttl(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    """A client may leave while a frontend tool waits and answer later (A2A, AG-UI, a page
    reopened): the run is not cancelled as abandoned while it waits; answered and followed
    again, it goes on."""
    provider.enqueue(call_turn(("call_f", "pick", "{}")), answer_turn("a it is"))
    async with tool_gateway(
        tmp_path, provider, AGENTS, unwatched_run_ttl_s=0.1, frontend_wait_timeout_s=30
    ) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="ui", message="Choose"))
        events: list = []
        end = await until(call, "tool.end", events)
        call.cancel()
        run = gateway.app.frontdoor.get_run(end.run_id)
        await asyncio.sleep(0.5)  # five times the unwatched TTL
        assert not run.done
        reply = await submit(gateway, end.run_id, end.tool_end.tool_id, {"choice": "a"})
        assert reply.outcome == gw.SUBMIT_OUTCOME_ACCEPTED
        request = gw.AttachRequest(run_id=end.run_id, after_seq=end.seq)
        rest = [event async for event in gateway.stub.Attach(request)]
    assert kinds(rest) == ["request.submit", "tool.result", *ANSWER]
    assert_invariants(events + rest)


async def test_submit_answers_precisely(tmp_path: Path, provider: LoopbackProvider) -> None:
    provider.enqueue(answer_turn("Hi"))
    async with tool_gateway(tmp_path, provider, AGENTS, submit_payload_limit_bytes=64) as gateway:
        events = await gateway.query("plain", "hi")
        run_id, chat_id = events[0].run_id, events[0].chat_id
        unknown_run = await submit(gateway, "nope", "t_00000000", 1)
        unknown_tool = await submit(gateway, run_id, "t_00000000", 1)
        other_chat = await submit(gateway, run_id, "t_00000000", 1, chat_id="other")
        same_chat = await submit(gateway, run_id, "t_00000000", 1, chat_id=chat_id)
        with pytest.raises(grpc.aio.AioRpcError) as too_large:
            await submit(gateway, run_id, "t_00000000", "x" * 100)
        with pytest.raises(grpc.aio.AioRpcError) as no_run:
            await submit(gateway, "", "t_00000000", 1)
    assert (unknown_run.accepted, unknown_run.outcome) == (False, gw.SUBMIT_OUTCOME_UNKNOWN_RUN)
    assert unknown_tool.outcome == gw.SUBMIT_OUTCOME_UNKNOWN_TOOL
    assert "has no tool 't_00000000' (waiting: none)" in unknown_tool.detail
    assert other_chat.outcome == gw.SUBMIT_OUTCOME_UNKNOWN_RUN
    assert same_chat.outcome == gw.SUBMIT_OUTCOME_UNKNOWN_TOOL
    assert too_large.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_info(too_large.value).reason == "PAYLOAD_TOO_LARGE"
    assert "exceeds the limit of 64 bytes" in too_large.value.details()
    assert no_run.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_an_unknown_tool_id_is_echoed_cut_short(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    """The answer to a submit for an unknown tool echoed its whole id: 6,000 characters in,
    6,000 out."""
    provider.enqueue(answer_turn("Hi"))
    async with tool_gateway(tmp_path, provider, AGENTS) as gateway:
        events = await gateway.query("plain", "hi")
        run_id = events[0].run_id
        unknown_tool = await submit(gateway, run_id, "t" * 6000, 1)
        expired = await submit(gateway, run_id + "x" * 6000, "t" * 6000, 1)
    shown = "t" * 64 + "…"
    assert (unknown_tool.outcome, unknown_tool.detail) == (
        gw.SUBMIT_OUTCOME_UNKNOWN_TOOL,
        f"run {run_id} has no tool {shown!r} (waiting: none)",
    )
    assert expired.outcome == gw.SUBMIT_OUTCOME_UNKNOWN_RUN and len(expired.detail) < 100


async def test_an_action_is_answered_ok_at_once(tmp_path: Path, provider: LoopbackProvider) -> None:
    provider.enqueue(call_turn(("call_a", "theme", '{"theme":"dark"}')), answer_turn("Dark now"))
    async with tool_gateway(tmp_path, provider, AGENTS) as gateway:
        events = await gateway.query("ui", "Go dark")
    assert kinds(events) == [
        *HEAD,
        "action.start",
        "action.args",
        "action.args",
        "action.end",
        "action.param",
        "action.result",
        *ANSWER,
    ]
    assert_invariants(events)
    start = events[3].action_start
    assert ID_FORMS["action"].match(start.action_id)
    assert (start.action_name, start.description) == ("theme", "Switch the theme.")
    assert [e.action_args.chunk_index for e in events[4:6]] == [0, 1]
    assert json_format.MessageToDict(events[7].action_param.param) == {"theme": "dark"}
    assert result_of(events[8]) == "OK"
    assert provider.requests[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_a",
        "name": "theme",
        "content": "OK",
    }


async def test_cancel_during_reasoning_closes_the_provider_stream(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    never = asyncio.Event()
    provider.enqueue([lb.reasoning("Thinking"), lb.Gate(never), lb.content("never")])
    async with tool_gateway(tmp_path, provider, AGENTS) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="plain", message="Think"))
        events: list = []
        delta = await until(call, "reasoning.delta", events)
        started = time.monotonic()
        reply = await gateway.stub.Cancel(gw.CancelRequest(run_id=delta.run_id))
        await provider.wait_disconnects(1, timeout=0.1)
        closed_after = time.monotonic() - started
        events += [event async for event in call]
    assert reply.cancelled and closed_after < 0.1
    assert kinds(events) == [
        *HEAD,
        "reasoning.start",
        "reasoning.delta",
        "reasoning.end",
        "run.cancel",
    ]
    assert_invariants(events)
    assert events[-1].run_cancel.reason == "cancel"


async def test_cancel_during_a_backend_tool_cancels_the_tool(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    probe = Probe()
    provider.enqueue(call_turn(("call_s", "forever", "{}")))
    async with tool_gateway(tmp_path, provider, AGENTS, probe) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="slow", message="Wait"))
        events: list = []
        end = await until(call, "tool.end", events)
        await asyncio.wait_for(probe.started.wait(), 1)
        run = gateway.app.frontdoor.get_run(end.run_id)
        started = time.monotonic()
        await gateway.stub.Cancel(gw.CancelRequest(run_id=end.run_id))
        await asyncio.wait_for(probe.cancelled.wait(), 0.1)
        await asyncio.wait_for(run.wait(), 0.1)
        elapsed = time.monotonic() - started
        events += [event async for event in call]
    assert elapsed < 0.1
    assert kinds(events) == HEAD + CALL + ["run.cancel"]
    assert_invariants(events)
    # the model's stream had been read to its end before the tool ran: nothing was left open
    assert (len(provider.requests), provider.disconnects) == (1, 0)


async def test_cancel_during_a_frontend_wait_expires_the_wait(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(call_turn(("call_f", "pick", "{}")))
    async with tool_gateway(tmp_path, provider, AGENTS) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="ui", message="Choose"))
        events: list = []
        end = await until(call, "tool.end", events)
        run = gateway.app.frontdoor.get_run(end.run_id)
        started = time.monotonic()
        await gateway.stub.Cancel(gw.CancelRequest(run_id=end.run_id))
        await asyncio.wait_for(run.wait(), 0.1)
        elapsed = time.monotonic() - started
        events += [event async for event in call]
        late = await submit(gateway, end.run_id, end.tool_end.tool_id, "a")
        waiting = gateway.app.bus.waits.waiting(end.run_id)
    assert elapsed < 0.1
    assert kinds(events) == HEAD + CALL + ["run.cancel"]
    assert (len(provider.requests), provider.disconnects) == (1, 0)
    assert waiting == []
    assert (late.outcome, late.detail) == (
        gw.SUBMIT_OUTCOME_EXPIRED,
        f"tool {end.tool_end.tool_id!r} stopped waiting (the run ended)",
    )
