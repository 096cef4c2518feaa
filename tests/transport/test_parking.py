"""A journaled run that only waits for an answer is parked: no task, woken by its answer,
its wait's deadline or a cancel; its stream goes on as if it had never stopped."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc

from service.providers.loopback import LoopbackProvider
from service.testing import Harness
from tests.core.tools.kit import (
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
from tests.transport.test_server import ROOT, _start_service, assert_closed
from tests.transport.test_submit_cancel import ANSWER, CALL, HEAD, submit, until

AGENTS = {
    "ui": agent(toolConfig=tools(frontends=("pick",))),
    "asks": agent("REACT", toolConfig=tools("ask_user")),
}


async def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        await asyncio.sleep(0.01)


def parked(gateway: Harness) -> Callable[[], bool]:
    lifecycle = gateway.app.frontdoor.lifecycle
    return lambda: lifecycle.parked_runs == 1 and lifecycle.active_runs == 0


async def test_a_waiting_run_is_parked_and_its_answer_wakes_it(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(call_turn(("call_f", "pick", '{"options":["a","b"]}')), answer_turn("a it is"))
    async with tool_gateway(tmp_path, provider, AGENTS, park_after_s=0.05) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="ui", message="Choose"))
        events: list = []
        end = await until(call, "tool.end", events)
        run_id, tool_id = end.run_id, end.tool_end.tool_id
        await eventually(parked(gateway))
        run = gateway.app.frontdoor.get_run(run_id)
        assert run.task is None and not run.done
        # a parked run still shows as a live run that waits
        chat = await gateway.stub.GetChat(gw.GetChatRequest(chat_id=end.chat_id))
        assert [w.tool_id for w in chat.live_run.waits] == [tool_id]
        reply = await submit(gateway, run_id, tool_id, {"choice": "a"})
        assert reply.outcome == gw.SUBMIT_OUTCOME_ACCEPTED
        events += [event async for event in call]
        whole = [e async for e in gateway.stub.Attach(gw.AttachRequest(run_id=run_id))]
        lifecycle = gateway.app.frontdoor.lifecycle
        assert (lifecycle.parked_runs, lifecycle.active_runs) == (0, 0)
    # one stream, as if the run had never stopped: no event repeated, no run.resume
    assert kinds(events) == HEAD + CALL + ["request.submit", "tool.result"] + ANSWER
    assert result_of(events[8]) == {"choice": "a"}
    assert_invariants(events)
    assert whole == events
    asked, answered = provider.requests
    assert answered["messages"][: len(asked["messages"])] == asked["messages"]
    assert answered["messages"][-1]["content"] == '{"choice": "a"}'


async def test_a_parked_wait_times_out_at_its_deadline(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(call_turn(("call_f", "pick", "{}")), answer_turn("nobody answered"))
    async with tool_gateway(
        tmp_path, provider, AGENTS, park_after_s=0.05, frontend_wait_timeout_s=1.0
    ) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="ui", message="Choose"))
        events: list = []
        await until(call, "tool.end", events)
        opened = time.monotonic()
        await eventually(parked(gateway))
        events += [event async for event in call]
        waited = time.monotonic() - opened
    assert kinds(events) == HEAD + CALL + ["tool.result"] + ANSWER
    timed_out = events[7].tool_result
    assert timed_out.error and result_of(events[7]) == (
        "Error: the user did not answer 'pick' within 1 s"
    )
    assert 0.9 <= waited < 3.0


async def test_a_parked_run_is_cancelled_without_running_again(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(call_turn(("call_f", "pick", "{}")))
    async with tool_gateway(tmp_path, provider, AGENTS, park_after_s=0.05) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="ui", message="Choose"))
        events: list = []
        end = await until(call, "tool.end", events)
        await eventually(parked(gateway))
        reply = await gateway.stub.Cancel(gw.CancelRequest(run_id=end.run_id))
        assert reply.cancelled
        events += [event async for event in call]
        late = await submit(gateway, end.run_id, end.tool_end.tool_id, {"choice": "a"})
    assert kinds(events) == HEAD + CALL + ["run.cancel"]
    assert events[-1].run_cancel.reason == "cancel"
    assert late.outcome == gw.SUBMIT_OUTCOME_EXPIRED
    assert len(provider.requests) == 1


async def test_a_question_asked_by_a_tool_parks_the_run_too(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    """A wait inside a tool call (ask_user) leaves the run idle: it is parked, and the
    answer reaches the question when the run goes on."""
    provider.enqueue(
        call_turn(("call_q", "ask_user", '{"question":"Which city?"}')),
        answer_turn("Lyon then"),
    )
    async with tool_gateway(tmp_path, provider, AGENTS, park_after_s=0.05) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="asks", message="Plan a trip"))
        events: list = []
        asked = await until(call, "question.ask", events)
        await eventually(parked(gateway))
        question_id = asked.question_ask.question_id
        reply = await submit(gateway, asked.run_id, question_id, {"answer": "Lyon"})
        assert reply.outcome == gw.SUBMIT_OUTCOME_ACCEPTED
        events += [event async for event in call]
    assert kinds(events)[-5:] == ["tool.result", *ANSWER]
    assert "run.resume" not in kinds(events)
    assert_invariants(events)
    assert '"Lyon"' in provider.requests[1]["messages"][-1]["content"]


async def test_a_run_that_waits_and_works_is_not_parked(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    """Two calls at once, one waiting for the user and one still running: the run keeps
    its task until all it does is wait."""
    provider.enqueue(
        call_turn(("call_f", "pick", "{}"), ("call_s", "forever", "{}")), answer_turn("done")
    )
    agents: dict[str, Any] = {"both": agent(toolConfig=tools("forever", frontends=("pick",)))}
    probe = Probe()
    async with tool_gateway(tmp_path, provider, agents, probe, park_after_s=0.05) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="both", message="Go"))
        events: list = []
        await until(call, "tool.end", events)
        end = await until(call, "tool.end", events)
        await probe.started.wait()
        await asyncio.sleep(0.3)
        lifecycle = gateway.app.frontdoor.lifecycle
        assert (lifecycle.parked_runs, lifecycle.active_runs) == (0, 1)
        probe.release.set()  # the backend call ends: now the run only waits
        await eventually(parked(gateway))
        pick = next(e.tool_start.tool_id for e in events if e.tool_start.tool_name == "pick")
        await submit(gateway, end.run_id, pick, {"choice": "a"})
        events += [event async for event in call]
    assert kinds(events)[-4:] == ANSWER
    assert probe.calls == [("slow", {})]  # not run again when the run woke
    assert_invariants(events)


# -- across restarts of a real service (the embedded default: the journal in SQLite) --------

SERVICE = {
    "AGW_AGENTS_DIR": str(ROOT / "agents"),
    "AGW_TOOLS_DIR": str(ROOT / "tools"),
    "AGW_MCP_SERVERS": "[]",
    "AGW_DEMO_DELAY_MS": "0",
    "AGW_PARK_AFTER_S": "0.1",
}


async def _waiting_run(port: int) -> tuple[list, str, str]:
    """Start a run of demo_frontend on the service at `port`: its events up to the wait, its
    run id and the id of the tool that waits."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = gateway_pb2_grpc.AgentGatewayStub(channel)
        call = stub.Query(gw.QueryRequest(agent_key="demo_frontend", message="Shall we start?"))
        events: list = []
        end = await until(call, "tool.end", events)
        call.cancel()
    return events, end.run_id, end.tool_end.tool_id


async def _stop(process: asyncio.subprocess.Process, how: signal.Signals) -> None:
    process.send_signal(how)
    await asyncio.wait_for(process.wait(), 15)


async def test_a_parked_run_survives_any_number_of_restarts(tmp_path: Path) -> None:
    """Five restarts, more than AGW_RESUME_ATTEMPTS: a run that only waits is never lost
    while it waits, and the answer, after the last restart, completes it."""
    process, port = await _start_service(tmp_path, **SERVICE)
    try:
        first, run_id, tool_id = await _waiting_run(port)
        await asyncio.sleep(0.5)  # parked
        for _ in range(5):
            await _stop(process, signal.SIGTERM)
            process, port = await _start_service(tmp_path, **SERVICE)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = gateway_pb2_grpc.AgentGatewayStub(channel)
            following = stub.Attach(gw.AttachRequest(run_id=run_id))
            seen: list = []
            await until(following, "tool.end", seen)
            request = gw.SubmitRequest(run_id=run_id, tool_id=tool_id)
            request.payload.struct_value.update({"choice": "Yes"})
            reply = await stub.Submit(request)
            assert reply.outcome == gw.SUBMIT_OUTCOME_ACCEPTED, reply
            seen += [event async for event in following]
        await _stop(process, signal.SIGTERM)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert seen[: len(first)] == first
    resumed = [e.run_resume for e in seen if e.type == "run.resume"]
    assert [r.attempt for r in resumed] == [1, 2, 3, 4, 5]
    assert {r.reason for r in resumed} == {"restart"}
    assert seen[-1].type == "run.complete"
    kinds_seen = [e.type for e in seen]
    answered = kinds_seen.index("request.submit")
    assert kinds_seen[answered : answered + 2] == ["request.submit", "tool.result"]
    assert "run.resume" not in kinds_seen[answered:]  # woken where it was parked
    assert_closed(seen)


async def test_a_wait_times_out_at_its_deadline_across_a_kill(tmp_path: Path) -> None:
    """The deadline is journaled when the wait opens: killed, and started again 3 s later,
    the run times out 6 s after its wait opened, not 6 s after the restart."""
    service = {**SERVICE, "AGW_FRONTEND_WAIT_TIMEOUT_S": "6"}
    process, port = await _start_service(tmp_path, **service)
    try:
        first, run_id, _ = await _waiting_run(port)
        opened = time.monotonic()
        await _stop(process, signal.SIGKILL)
        await asyncio.sleep(3)
        process, port = await _start_service(tmp_path, **service)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = gateway_pb2_grpc.AgentGatewayStub(channel)
            after = first[-1].seq
            call = stub.Attach(gw.AttachRequest(run_id=run_id, after_seq=after))
            rest: list = []
            result = await until(call, "tool.result", rest)
            timed_out = time.monotonic() - opened
            rest += [event async for event in call]
        await _stop(process, signal.SIGTERM)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert result.tool_result.error
    assert "did not answer 'confirm_dialog' within 6 s" in result_of(result)
    assert 5.5 <= timed_out < 8.5, timed_out
    assert [e.type for e in rest[:1]] == ["run.resume"]
    assert rest[-1].type == "run.complete"
    assert_closed([*first, *rest])
