"""Escalation (REACT → PLAN_EXECUTE by `plan_create`) and the mode a query chooses, in-process."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agw.v1 import events_pb2 as pb

from service.core.agents.loader import AgentDefinitionError, parse_agent_text
from service.core.chats.history import snapshot_form
from service.core.errors import InvalidRequest
from service.core.modes.escalation import NOT_NOW, PLAN_CREATE_TOOL, SWITCHED
from service.core.tools.planning import EXECUTOR_TOOLS_HEADING
from service.testing import InProcess, ScriptedModel, content, finish, tool_call, usage, write_agent
from tests.core.modes.test_inprocess import answer_turn, call_turn
from tests.core.tools.kit import Probe, agent, assert_invariants, kinds, result_of, tools

HEAD = ["request.query", "chat.start", "run.start"]
CALL = ["tool.start", "tool.args", "tool.args", "tool.end", "tool.result"]
PLANNED = [*CALL[:4], "plan.create", "tool.result"]
REPORTED = ["task.start", "plan.update", *CALL, "task.complete", "plan.update"]
PLAN_EXECUTE = {
    "plan": {"systemPrompt": "Plan it."},
    "execute": {"systemPrompt": "Do it."},
}


def escalating(**extra: Any) -> dict[str, Any]:
    return agent(
        "REACT",
        "Act.",
        toolConfig=tools("echo"),
        react={"systemPrompt": "Act.", "escalate": True},
        planExecute=PLAN_EXECUTE,
        **extra,
    )


def plan_turn(call_id: str, *descriptions: str) -> list:
    return call_turn(
        call_id, "_plan_add_tasks_", {"tasks": [{"description": d} for d in descriptions]}
    )


def report_turn(call_id: str, task_id: str, result: str) -> list:
    return call_turn(
        call_id,
        "_plan_update_task_",
        {"taskId": task_id, "status": "completed", "result": result},
    )


@pytest.fixture
def model() -> ScriptedModel:
    return ScriptedModel()


@pytest.fixture
async def core(tmp_path: Path, model: ScriptedModel) -> AsyncIterator[InProcess]:
    agents_dir = tmp_path / "agents"
    write_agent(agents_dir, "esc", escalating())
    write_agent(
        agents_dir,
        "both",
        agent(
            "REACT",
            "Act.",
            modes=["REACT", "PLAN_EXECUTE"],
            toolConfig=tools("echo"),
            planExecute=PLAN_EXECUTE,
        ),
    )
    async with InProcess.start(agents_dir, model, builtin=Probe().tools()) as running:
        yield running


async def recorded(core: InProcess, run_id: str) -> None:
    """Wait until the run's task has ended and its chat records are written."""
    await core.frontdoor.runs[run_id].ended()
    await core.frontdoor.flush()


async def replayed(core: InProcess, live: list[pb.Event]) -> None:
    """GetChat shows the run as its live stream did; Attach replays it whole, from any seq."""
    await recorded(core, live[0].run_id)
    view = await core.frontdoor.get_chat(live[0].chat_id)

    def comparable(events: list[pb.Event]) -> list[pb.Event]:
        out = []
        for event in events:
            copy = pb.Event()
            copy.CopyFrom(event)
            copy.seq = copy.timestamp = 0
            out.append(copy)
        return out

    assert comparable(view.events) == comparable(snapshot_form(live))
    for after in (0, len(live) // 2):
        attached = [e async for e in await core.frontdoor.attach(live[0].run_id, after)]
        assert attached == live[after:]


async def test_plan_create_switches_the_run_to_plan_execute_from_the_conversation(
    core: InProcess, model: ScriptedModel
) -> None:
    model.enqueue(
        call_turn("c1", "echo", {"text": "hi"}),
        call_turn("e1", PLAN_CREATE_TOOL, {"reason": "several steps"}),
        plan_turn("p1", "Echo a"),
        report_turn("u1", "task_1", "a echoed"),
    )
    events = await core.query("esc", "Echo hi, then plan")
    assert kinds(events) == [*HEAD, *CALL, *CALL, *PLANNED, *REPORTED, "run.complete"]
    assert_invariants(events)
    assert events[8].tool_start.tool_name == PLAN_CREATE_TOOL
    assert result_of(events[12]) == SWITCHED and not events[12].tool_result.error
    assert [t.description for t in events[17].plan_create.plan.tasks] == ["Echo a"]
    assert {e.task_id for e in events[19:28]} == {"task_1"}
    assert {e.task_id for e in events[:19]} == {e.task_id for e in events[28:]} == {""}
    react_1, react_2, planning, task_1 = model.requests
    assert [r.stage for r in model.requests] == ["react", "react", "plan", "execute"]
    assert [t["function"]["name"] for t in react_1.tools] == ["echo", PLAN_CREATE_TOOL]
    assert [t["function"]["name"] for t in react_2.tools] == ["echo", PLAN_CREATE_TOOL]
    # The plan stage starts from the conversation so far, the plan_create call answered.
    system, *conversation = planning.messages
    assert system["content"] == f"Plan it.\n\n{EXECUTOR_TOOLS_HEADING}\n- echo: The echo test tool."
    assert [m["role"] for m in conversation] == ["user", "assistant", "tool", "assistant", "tool"]
    assert conversation[0] == {"role": "user", "content": "Echo hi, then plan"}
    assert conversation[3]["tool_calls"][0]["function"]["name"] == PLAN_CREATE_TOOL
    assert conversation[4] == {
        "role": "tool",
        "tool_call_id": "e1",
        "name": PLAN_CREATE_TOOL,
        "content": SWITCHED,
    }
    assert (planning.tool_choice, [t["function"]["name"] for t in planning.tools]) == (
        "required",
        ["_plan_add_tasks_"],
    )
    assert [m["role"] for m in task_1.messages] == ["system", "user"]
    await replayed(core, events)


async def test_a_react_run_that_never_calls_plan_create_stays_react(
    core: InProcess, model: ScriptedModel
) -> None:
    model.enqueue(answer_turn("Just ", "this."))
    events = await core.query("esc", "Hello")
    assert kinds(events) == [
        *HEAD,
        *["content.start", "content.delta", "content.delta", "content.end"],
        "run.complete",
    ]
    assert_invariants(events)
    [request] = model.requests
    assert [t["function"]["name"] for t in request.tools] == ["echo", PLAN_CREATE_TOOL]
    await replayed(core, events)


async def test_other_calls_of_the_escalating_turn_are_refused(
    core: InProcess, model: ScriptedModel
) -> None:
    model.enqueue(
        [
            tool_call(0, "c1", "echo", '{"text": "x"}'),
            tool_call(1, "e1", PLAN_CREATE_TOOL, "{}"),
            finish("tool_calls"),
            usage(10, 5),
        ],
        plan_turn("p1", "Echo a"),
        report_turn("u1", "task_1", "done"),
    )
    events = await core.query("esc", "Plan it")
    assert kinds(events) == [
        *HEAD,
        *["tool.start", "tool.args", "tool.start", "tool.args", "tool.end", "tool.end"],
        *["tool.result", "tool.result"],
        *PLANNED,
        *REPORTED,
        "run.complete",
    ]
    assert_invariants(events)
    refused, switched = events[9], events[10]
    assert (refused.tool_result.tool_id, refused.tool_result.error) == ("c1", True)
    assert result_of(refused) == f"Error: {NOT_NOW}"
    assert (switched.tool_result.tool_id, result_of(switched)) == ("e1", SWITCHED)
    assert model.pending == 0


async def test_a_query_chooses_a_mode_the_agent_allows(
    core: InProcess, model: ScriptedModel
) -> None:
    model.enqueue(plan_turn("p1", "Echo a"), report_turn("u1", "task_1", "a"))
    events = await core.query("both", "Plan this", mode="PLAN_EXECUTE")
    assert kinds(events) == [*HEAD, *PLANNED, *REPORTED, "run.complete"]
    assert [r.stage for r in model.requests] == ["plan", "execute"]
    model.enqueue([content("Hi"), finish("stop")])
    events = await core.query("both", "Just answer", mode="REACT")
    assert kinds(events)[-2:] == ["content.end", "run.complete"]
    assert model.requests[-1].stage == "react"
    assert [t["function"]["name"] for t in model.requests[-1].tools] == ["echo"]


@pytest.mark.parametrize(("key", "mode"), [("both", "ONESHOT"), ("esc", "PLAN_EXECUTE")])
async def test_a_mode_the_agent_does_not_allow_is_refused(
    core: InProcess, model: ScriptedModel, key: str, mode: Any
) -> None:
    with pytest.raises(InvalidRequest, match=f"does not run in mode {mode}"):
        await core.query(key, "Plan this", mode=mode)
    assert model.calls == []


def test_escalation_and_modes_need_their_stages() -> None:
    react = {"systemPrompt": "Act.", "escalate": True}
    with pytest.raises(AgentDefinitionError) as caught:
        parse_agent_text(json.dumps({"mode": "REACT", "react": react}), key="a")
    assert [str(i) for i in caught.value.issues] == [
        "planExecute.plan: is required by react.escalate (with a systemPrompt)",
        "planExecute.execute: is required by react.escalate (with a systemPrompt)",
    ]
    text = json.dumps(
        {"mode": "REACT", "modes": ["PLAN_EXECUTE", "ONESHOT"], "react": {"systemPrompt": "A"}}
    )
    with pytest.raises(AgentDefinitionError) as caught:
        parse_agent_text(text, key="a")
    assert [str(i) for i in caught.value.issues] == [
        "modes: must include the agent's mode REACT",
        "planExecute.plan: is required by mode PLAN_EXECUTE (with a systemPrompt)",
        "planExecute.execute: is required by mode PLAN_EXECUTE (with a systemPrompt)",
        "plain: is required by mode ONESHOT (with a systemPrompt)",
    ]
    both = parse_agent_text(json.dumps(escalating(modes=["PLAN_EXECUTE", "REACT"])), key="a")
    assert both.allowed_modes == ("REACT", "PLAN_EXECUTE")
    assert both.escalates and not both.in_mode("PLAN_EXECUTE").escalates
    assert both.stage_names == ("react", "plan", "execute")
