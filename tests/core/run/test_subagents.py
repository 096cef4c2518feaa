"""Subagents: agents called as tools, their nested runs inside the caller's stream, in-process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from service.core.agents.loader import AgentDefinitionError, parse_agent_text
from service.core.errors import InvalidRequest, ToolNotFound
from service.testing import (
    Gate,
    InProcess,
    ScriptedModel,
    content,
    fail,
    finish,
    write_agent,
)
from tests.core.modes.test_escalation import recorded, replayed
from tests.core.modes.test_inprocess import answer_turn, call_turn
from tests.core.tools.kit import Probe, agent, assert_invariants, kinds, result_of

HEAD = ["request.query", "chat.start", "run.start"]
CALL = ["tool.start", "tool.args", "tool.args", "tool.end", "tool.result"]
ANSWER = ["content.start", "content.delta", "content.end"]


def calling(*agents: str, **extra: Any) -> dict[str, Any]:
    """A REACT agent offered the agents `agents` (and the echo tool) as tools."""
    return agent(
        "REACT",
        "Delegate.",
        toolConfig={"backends": ["echo"], "agents": list(agents)},
        description="Calls others.",
        **extra,
    )


def helper(**extra: Any) -> dict[str, Any]:
    return agent(
        "REACT",
        "Help.",
        toolConfig={"backends": ["echo"]},
        description="Echoes things.",
        **extra,
    )


def delegate(call_id: str, key: str, task: str) -> list:
    return call_turn(call_id, key, {"task": task})


@pytest.fixture
def model() -> ScriptedModel:
    return ScriptedModel()


@pytest.fixture
def agents_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "agents"
    write_agent(directory, "boss", calling("helper"))
    write_agent(directory, "helper", helper())
    write_agent(directory, "lean", calling("helper", budget={"maxModelCalls": 2}))
    return directory


@pytest.fixture
async def core(agents_dir: Path, model: ScriptedModel) -> AsyncIterator[InProcess]:
    async with InProcess.start(agents_dir, model, builtin=Probe().tools()) as running:
        yield running


async def test_a_subagent_runs_nested_in_the_callers_stream(
    core: InProcess, model: ScriptedModel
) -> None:
    model.enqueue(
        delegate("h1", "helper", "Echo hi"),
        call_turn("c1", "echo", {"text": "hi"}),
        answer_turn("Echoed ", "hi."),
        answer_turn("It echoed."),
    )
    events = await core.query("boss", "Get hi echoed")
    nested = [*CALL, "content.start", "content.delta", "content.delta", "content.end"]
    assert kinds(events) == [*HEAD, *CALL[:4], *nested, "tool.result", *ANSWER, "run.complete"]
    assert_invariants(events)
    run_id = events[0].run_id
    assert [e.parent_tool_id for e in events] == ["h1" if 7 <= i < 16 else "" for i in range(21)]
    assert events[3].tool_start.tool_name == "helper"
    assert events[3].tool_start.description.startswith("Delegate a task to the agent 'helper'")
    assert events[7].tool_start.tool_name == "echo"
    assert result_of(events[11]) == {"echo": "hi", "taskId": ""}
    assert events[12].content_start.content_id == f"{run_id}_h1_c_1"
    assert (events[16].tool_result.tool_id, result_of(events[16])) == ("h1", "Echoed hi.")
    assert events[17].content_start.content_id == f"{run_id}_c_1"
    asked, echo, answered, final = model.requests
    assert [r.stage for r in model.requests] == ["react"] * 4
    assert [t["function"]["name"] for t in asked.tools] == ["echo", "helper"]
    assert asked.tools[1]["function"]["parameters"]["required"] == ["task"]
    assert echo.messages == [
        {"role": "system", "content": "Help.\n\n## After calling a tool\n- echo: Quote the echo."},
        {"role": "user", "content": "Echo hi"},
    ]
    assert [t["function"]["name"] for t in echo.tools] == ["echo"]
    assert [m["role"] for m in answered.messages] == ["system", "user", "assistant", "tool"]
    assert final.messages[-1] == {
        "role": "tool",
        "tool_call_id": "h1",
        "name": "helper",
        "content": "Echoed hi.",
    }
    await replayed(core, events)
    # The chat records the caller's conversation only; the nested run is kept as events.
    view = await core.frontdoor.get_chat(events[0].chat_id, include_records=True)
    steps = [r for r in view.records if r["_type"] == "step"]
    assert [m["role"] for s in steps for m in s["messages"]] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    kept = [(e["type"], e["_at"], e["parentToolId"]) for e in steps[0]["_events"]]
    assert kept == [
        ("tool.snapshot", 1, "h1"),
        ("tool.result", 1, "h1"),
        ("content.snapshot", 1, "h1"),
    ]


async def test_the_nested_runs_calls_count_in_the_callers_budget(
    core: InProcess, model: ScriptedModel
) -> None:
    model.enqueue(
        delegate("h1", "helper", "Echo hi"),
        call_turn("c1", "echo", {"text": "hi"}),
        answer_turn("never asked"),
    )
    events = await core.query("lean", "Get hi echoed")
    assert kinds(events) == [*HEAD, *CALL[:4], *CALL, "tool.result", "run.error"]
    assert_invariants(events)
    failed = events[12]
    assert (failed.tool_result.tool_id, failed.tool_result.error) == ("h1", True)
    assert result_of(failed) == (
        "Error: 'helper' failed: the run used up its maxModelCalls budget (2 model calls)"
    )
    error = events[-1].run_error.error
    assert (error.reason, error.metadata["budget"]) == ("BUDGET_EXHAUSTED", "maxModelCalls")
    assert len(model.requests) == 2 and model.pending == 1


async def test_cancelling_the_run_cancels_the_nested_run_and_closes_its_blocks(
    core: InProcess, model: ScriptedModel
) -> None:
    model.enqueue(
        delegate("h1", "helper", "Talk"),
        [content("Hal"), Gate(asyncio.Event()), content("f"), finish("stop")],
    )
    events = await core.query(
        "boss", "Talk", cancel_when=lambda e: e.type == "content.delta" and e.parent_tool_id
    )
    assert kinds(events) == [*HEAD, *CALL[:4], *ANSWER, "run.cancel"]
    assert_invariants(events)
    assert [e.parent_tool_id for e in events[7:10]] == ["h1"] * 3
    assert events[-1].run_cancel.reason == "cancel"
    assert [(c.finished, c.closed) for c in model.calls] == [(True, True), (False, True)]
    await replayed(core, events)


async def test_the_callers_time_budget_bounds_the_nested_run(
    agents_dir: Path, model: ScriptedModel
) -> None:
    write_agent(agents_dir, "hasty", calling("helper", budget={"timeoutMs": 300}))
    model.enqueue(
        delegate("h1", "helper", "Talk"),
        [content("Hal"), Gate(asyncio.Event()), content("f"), finish("stop")],
    )
    async with InProcess.start(agents_dir, model, builtin=Probe().tools()) as core:
        events = await core.query("hasty", "Talk")
        assert kinds(events) == [*HEAD, *CALL[:4], *ANSWER, "run.error"]
        assert_invariants(events)
        assert [e.parent_tool_id for e in events[7:10]] == ["h1"] * 3
        error = events[-1].run_error.error
        assert (error.reason, error.metadata["budget"]) == ("BUDGET_EXHAUSTED", "timeoutMs")
        await replayed(core, events)


async def test_a_failing_nested_run_is_the_calls_error_and_the_caller_goes_on(
    core: InProcess, model: ScriptedModel
) -> None:
    model.enqueue(
        delegate("h1", "helper", "Talk"),
        [content("Hal"), fail("upstream overloaded")],
        answer_turn("The helper failed."),
    )
    events = await core.query("boss", "Talk")
    assert kinds(events) == [*HEAD, *CALL[:4], *ANSWER, "tool.result", *ANSWER, "run.complete"]
    assert_invariants(events)
    assert [e.parent_tool_id for e in events[7:10]] == ["h1"] * 3
    failed = events[10].tool_result
    assert (failed.tool_id, failed.error) == ("h1", True)
    assert result_of(events[10]) == (
        "Error: 'helper' failed: provider 'scripted': stream error: upstream overloaded"
    )
    await replayed(core, events)


async def test_a_nested_plan_answers_with_its_summary(
    agents_dir: Path, model: ScriptedModel
) -> None:
    planner = agent(
        "PLAN_EXECUTE",
        planExecute={
            "plan": {"systemPrompt": "Plan it."},
            "execute": {"systemPrompt": "Do it."},
            "summary": {"systemPrompt": "Sum it up.", "toolConfig": None},
        },
        toolConfig={"backends": ["echo"]},
    )
    write_agent(agents_dir, "planner", planner)
    write_agent(agents_dir, "chief", calling("planner"))
    tasks = {"tasks": [{"description": "Echo a"}]}
    update = {"taskId": "task_1", "status": "completed", "result": "a"}
    model.enqueue(
        delegate("h1", "planner", "Plan a"),
        call_turn("p1", "_plan_add_tasks_", tasks),
        call_turn("u1", "_plan_update_task_", update),
        answer_turn("Planned: a."),
        answer_turn("Done."),
    )
    async with InProcess.start(agents_dir, model, builtin=Probe().tools()) as core:
        events = await core.query("chief", "Plan a")
        assert_invariants(events)
        nested = [e for e in events if e.parent_tool_id == "h1"]
        assert kinds(nested) == [
            *CALL[:4],
            "plan.create",
            "tool.result",
            "task.start",
            "plan.update",
            *CALL,
            "task.complete",
            "plan.update",
            *ANSWER,
        ]
        assert {e.task_id for e in nested[6:15]} == {"task_1"}
        result = next(
            e for e in events if e.type == "tool.result" and e.tool_result.tool_id == "h1"
        )
        assert result_of(result) == "Planned: a."
        await replayed(core, events)
        view = await core.frontdoor.get_chat(events[0].chat_id, include_records=True)
        assert not any("plan" in r for r in view.records)  # the nested plan is not the chat's


async def test_subagents_that_form_a_cycle_nest_too_deep_or_are_unknown_are_refused(
    agents_dir: Path, model: ScriptedModel
) -> None:
    write_agent(agents_dir, "a", calling("b"))
    write_agent(agents_dir, "b", calling("a"))
    for key, next_key in zip("cdef", "defg", strict=True):
        write_agent(agents_dir, key, calling(next_key))
    write_agent(agents_dir, "g", helper())
    write_agent(agents_dir, "x", calling("nobody"))
    async with InProcess.start(agents_dir, model, builtin=Probe().tools()) as core:
        with pytest.raises(InvalidRequest, match=r"in a cycle \(a → b → a\)"):
            await core.query("a", "Go")
        with pytest.raises(InvalidRequest, match=r"more than 3 deep \(c → d → e → f → g\)"):
            await core.query("c", "Go")
        with pytest.raises(ToolNotFound, match="agents: 'nobody' is not a loaded agent"):
            await core.query("x", "Go")
        model.enqueue(
            delegate("h1", "e", "Go"),
            delegate("h2", "f", "Go"),
            delegate("h3", "g", "Go"),
            answer_turn("g went"),
            answer_turn("f went"),
            answer_turn("e went"),
            answer_turn("d went"),
        )
        events = await core.query("d", "Go")  # d → e → f → g: three deep
        assert_invariants(events)
        assert [(e.type, e.parent_tool_id) for e in events if "start" in e.type][2:] == [
            ("tool.start", ""),
            ("tool.start", "h1"),
            ("tool.start", "h2"),
            ("content.start", "h3"),
            ("content.start", "h2"),
            ("content.start", "h1"),
            ("content.start", ""),
        ]
        run_id = events[0].run_id
        answers = [e.content_start.content_id for e in events if e.type == "content.start"]
        assert answers == [
            f"{run_id}_h1_h2_h3_c_1",
            f"{run_id}_h1_h2_c_1",
            f"{run_id}_h1_c_1",
            f"{run_id}_c_1",
        ]
        results = [result_of(e) for e in events if e.type == "tool.result"]
        assert results == ["g went", "f went", "e went"]
    assert len(model.calls) == 7


async def test_a_call_that_would_close_a_cycle_is_refused_when_it_is_made(
    core: InProcess, model: ScriptedModel, agents_dir: Path
) -> None:
    gate = asyncio.Event()
    model.enqueue(
        [Gate(gate), *delegate("h1", "helper", "Ask back")],
        delegate("h2", "boss", "Loop"),
        answer_turn("Could not."),
        answer_turn("Fine."),
    )
    run = asyncio.create_task(core.query("boss", "Loop"))
    await asyncio.sleep(0.05)  # the first call waits at its gate
    assert len(model.calls) == 1
    write_agent(agents_dir, "helper", calling("boss"))  # the helper now calls its caller
    core.frontdoor.agents.load_all()
    gate.set()
    events = await run
    assert_invariants(events)
    refused = next(e for e in events if e.type == "tool.result" and e.tool_result.tool_id == "h2")
    assert refused.parent_tool_id == "h1" and refused.tool_result.error
    assert result_of(refused) == "Error: agent 'boss' is already working on this run: no cycles"
    assert events[-1].type == "run.complete"
    await recorded(core, events[0].run_id)


def test_an_agent_offered_as_a_tool_needs_a_name_no_other_tool_has() -> None:
    text = json.dumps(calling("echo"))
    with pytest.raises(AgentDefinitionError) as caught:
        parse_agent_text(text, key="a")
    assert [str(i) for i in caught.value.issues] == [
        "toolConfig.agents[0]: duplicate tool name 'echo' (see backends[0])"
    ]
    parsed = parse_agent_text(json.dumps(calling("helper")), key="a")
    assert parsed.stage("react").tools.agents == ("helper",)
    assert parsed.tool_names() == ["echo", "helper"]
