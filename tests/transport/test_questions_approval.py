"""Questions to the user (`ask_user`) and the plan approval gate, answered through Submit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agw.v1 import gateway_pb2 as gw
from google.protobuf import json_format

from service.providers.loopback import LoopbackProvider
from tests.core.modes.test_plan_execute import add_tasks, planner, report
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
from tests.transport.test_chat_modes import assert_replay
from tests.transport.test_orchestration import recorded
from tests.transport.test_submit_cancel import submit, until

ASK = call_turn(
    ("call_q", "ask_user", json.dumps({"question": "Which city?", "options": ["Oslo", "Rome"]}))
)


async def test_the_model_asks_and_gets_the_users_choice(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(ASK, answer_turn("Rome it is."))
    agents = {"a": agent(toolConfig=tools("ask_user"))}
    async with tool_gateway(tmp_path, provider, agents, Probe()) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="a", message="Weather?"))
        events: list = []
        ask = await until(call, "question.ask", events)
        question = ask.question_ask
        assert (question.question, list(question.options)) == ("Which city?", ["Oslo", "Rome"])
        assert question.question_id.startswith("q_") and question.timeout_ms > 0
        assert (await submit(gateway, ask.run_id, question.question_id, "Rome")).accepted
        events += [e async for e in call]
    assert_invariants(events)
    answer = next(e.question_answer for e in events if e.type == "question.answer")
    assert json_format.MessageToDict(answer.answer) == "Rome" and not answer.timed_out
    result = next(e for e in events if e.type == "tool.result")
    assert result_of(result) == "Rome"
    assert provider.requests[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_q",
        "name": "ask_user",
        "content": "Rome",
    }


async def test_a_structured_question_with_several_choices(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    arguments = {
        "question": "Which cities?",
        "options": [{"label": "Oslo", "description": "Cold", "recommended": True}, "Rome"],
        "multiSelect": True,
        "allowFreeText": True,
    }
    provider.enqueue(call_turn(("call_q", "ask_user", json.dumps(arguments))), answer_turn("Ok."))
    agents = {"a": agent(toolConfig=tools("ask_user"))}
    async with tool_gateway(tmp_path, provider, agents, Probe()) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="a", message="Trip?"))
        events: list = []
        ask = await until(call, "question.ask", events)
        question = ask.question_ask
        assert list(question.options) == ["Oslo", "Rome"]
        assert [(c.label, c.description, c.recommended) for c in question.choices] == [
            ("Oslo", "Cold", True),
            ("Rome", "", False),
        ]
        assert question.multi_select and question.allow_free_text
        answer = ["Oslo", "Bergen"]
        assert (await submit(gateway, ask.run_id, question.question_id, answer)).accepted
        events += [e async for e in call]
        await recorded(gateway, events)
        await assert_replay(gateway, events)
    assert_invariants(events)
    assert kinds(events)[3:13] == [
        "tool.start",
        "tool.args",
        "tool.args",
        "tool.end",
        "question.ask",
        "request.submit",
        "question.answer",
        "tool.result",
        "content.start",
        "content.delta",
    ]
    assert result_of(events[10]) == answer
    assert json.loads(provider.requests[1]["messages"][-1]["content"]) == answer


async def test_an_unanswered_question_times_out_into_the_result(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(ASK, answer_turn("No answer, then."))
    agents = {"a": agent(toolConfig=tools("ask_user"))}
    async with tool_gateway(
        tmp_path, provider, agents, Probe(), frontend_wait_timeout_s=0.2
    ) as gateway:
        events = await gateway.query("a", "Weather?")
    answer = next(e.question_answer for e in events if e.type == "question.answer")
    assert answer.timed_out
    result = next(e for e in events if e.type == "tool.result")
    assert result.tool_result.error and "did not answer" in str(result_of(result))
    assert events[-1].type == "run.complete"


@pytest.mark.parametrize(("payload", "approved"), [({"approved": True}, True), (False, False)])
async def test_plan_approval_gate(
    tmp_path: Path, provider: LoopbackProvider, payload: object, approved: bool
) -> None:
    gated = planner()
    gated["planExecute"]["plan"]["approval"] = True
    provider.enqueue(
        add_tasks("p1", "Echo a"),
        call_turn(("c1", "echo", '{"text":"a"}')),
        report("u1", "task_1", "completed", "a echoed"),
    )
    async with tool_gateway(tmp_path, provider, {"p": gated}, Probe()) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="p", message="Echo a"))
        events: list = []
        gate = await until(call, "plan.approval", events)
        approval = gate.plan_approval
        assert approval.approval_id.startswith("appr_")
        assert [t.description for t in approval.plan.tasks] == ["Echo a"]
        assert not any(e.type == "task.start" for e in events)
        assert (await submit(gateway, gate.run_id, approval.approval_id, payload)).accepted
        events += [e async for e in call]
    assert_invariants(events)
    types = [e.type for e in events]
    if approved:
        assert "task.complete" in types and events[-1].run_complete.finish_reason == "stop"
    else:
        assert "task.start" not in types
        assert events[-1].run_complete.finish_reason == "plan_rejected"
        last_plan = [e for e in events if e.type == "plan.update"][-1].plan_update.plan
        assert {t.status for t in last_plan.tasks} == {5}  # TASK_STATUS_CANCELED
        assert len(provider.requests) == 1
