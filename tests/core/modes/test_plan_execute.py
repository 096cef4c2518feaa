"""PLAN_EXECUTE: the plan call(s), tasks with their ids, reports with one repair, the summary."""

from __future__ import annotations

import json
from pathlib import Path

from agw.v1 import events_pb2 as pb

from service.core.modes.plan_execute import GENERATE_INSTRUCTION
from service.providers.loopback import LoopbackProvider
from tests.core.tools.kit import (
    agent,
    answer_turn,
    assert_invariants,
    call_turn,
    kinds,
    result_of,
    tool_gateway,
    tools,
)

HEAD = ["request.query", "chat.start", "run.start"]
CALL = ["tool.start", "tool.args", "tool.args", "tool.end", "tool.result"]
ANSWER = ["content.start", "content.delta", "content.end"]
THINKER = {"reasoning": {"enabled": True, "effort": "HIGH"}}


def add_tasks(call_id: str, *descriptions: str) -> list:
    tasks = json.dumps({"tasks": [{"description": d} for d in descriptions]})
    return call_turn((call_id, "_plan_add_tasks_", tasks))


def report(call_id: str, task_id: str, status: str, result: str) -> list:
    arguments = json.dumps({"taskId": task_id, "status": status, "result": result})
    return call_turn((call_id, "_plan_update_task_", arguments))


def planner(**extra: object) -> dict:
    plan_execute = {
        "plan": {"systemPrompt": "Plan it.", "deepThinking": extra.pop("deep", False)},
        "execute": {"systemPrompt": "Do it."},
    }
    if extra.pop("summary", False):
        plan_execute["summary"] = {"systemPrompt": "Sum it up.", "toolConfig": None}
    return agent(
        "PLAN_EXECUTE",
        toolConfig=tools("echo"),
        modelConfig=THINKER,
        planExecute=plan_execute,
        **extra,
    )


async def test_plan_tasks_and_summary(tmp_path: Path, provider: LoopbackProvider) -> None:
    provider.enqueue(
        add_tasks("p1", "Echo a", "Echo b"),
        call_turn(("c1", "echo", '{"text":"a"}')),
        report("u1", "task_1", "completed", "a echoed"),
        report("u2", "task_2", "failed", "no b"),
        answer_turn("Summary"),
    )
    async with tool_gateway(tmp_path, provider, {"p": planner(summary=True)}) as gateway:
        events = await gateway.query("p", "Echo a and b")
    assert kinds(events) == [
        *HEAD,
        *CALL[:4],
        "plan.create",
        "tool.result",
        "task.start",
        "plan.update",
        *CALL,
        *CALL,
        "task.complete",
        "plan.update",
        "task.start",
        "plan.update",
        *CALL,
        "task.fail",
        "plan.update",
        *ANSWER,
        "run.complete",
    ]
    assert_invariants(events)
    task_of = [e.task_id for e in events]
    assert set(task_of[:9]) == {""}
    assert set(task_of[9:23]) == {"task_1"} and set(task_of[23:32]) == {"task_2"}
    assert set(task_of[32:]) == {""}

    create = events[7].plan_create
    assert create.plan_id.startswith("p_")
    assert [(t.task_id, t.description, t.status) for t in create.plan.tasks] == [
        ("task_1", "Echo a", pb.TASK_STATUS_INIT),
        ("task_2", "Echo b", pb.TASK_STATUS_INIT),
    ]
    assert result_of(events[8]) == {
        "planId": create.plan_id,
        "tasks": [
            {"taskId": "task_1", "description": "Echo a"},
            {"taskId": "task_2", "description": "Echo b"},
        ],
    }
    assert events[9].task_start.description == "Echo a"
    assert result_of(events[15]) == {"echo": "a", "taskId": "task_1"}
    assert result_of(events[20]) == "OK"
    assert events[21].task_complete.description == "a echoed"
    fail = events[30].task_fail.error
    assert (fail.reason, fail.message) == ("TASK_FAILED", "no b")
    final = events[31].plan_update.plan
    assert [t.status for t in final.tasks] == [pb.TASK_STATUS_COMPLETED, pb.TASK_STATUS_FAILED]

    plan_call, task_1, _, task_2, summary = provider.requests
    assert plan_call["tool_choice"] == "required" and "reasoning_effort" not in plan_call
    assert [t["function"]["name"] for t in plan_call["tools"]] == ["_plan_add_tasks_"]
    assert plan_call["messages"][0]["content"] == (
        "Plan it.\n\n## Tools available when the tasks are executed\n- echo: The echo test tool."
    )
    assert [t["function"]["name"] for t in task_1["tools"]] == ["echo", "_plan_update_task_"]
    assert task_1["reasoning_effort"] == "high" and "tool_choice" not in task_1
    assert "Current task id: task_1\nYour task: Echo a" in task_1["messages"][1]["content"]
    assert "- task_1 [completed]: Echo a → a echoed" in task_2["messages"][1]["content"]
    assert "tools" not in summary
    assert "- task_2 [failed]: Echo b → no b" in summary["messages"][1]["content"]


async def test_deep_thinking_drafts_then_generates(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        answer_turn("First a.", reasoning="Let me see"),
        add_tasks("p1", "Do a"),
        report("u1", "task_1", "completed", "ok"),
    )
    async with tool_gateway(tmp_path, provider, {"p": planner(deep=True)}) as gateway:
        events = await gateway.query("p", "Do a")
    assert kinds(events) == [
        *HEAD,
        "reasoning.start",
        "reasoning.delta",
        "reasoning.end",
        *ANSWER,
        *CALL[:4],
        "plan.create",
        "tool.result",
        "task.start",
        "plan.update",
        *CALL,
        "task.complete",
        "plan.update",
        "run.complete",
    ]
    draft, generate, _ = provider.requests
    assert (draft["tool_choice"], draft["reasoning_effort"]) == ("none", "high")
    assert [t["function"]["name"] for t in draft["tools"]] == ["_plan_add_tasks_"]
    assert generate["tool_choice"] == "required" and "reasoning_effort" not in generate
    assert generate["messages"][-2:] == [
        {"role": "assistant", "content": "First a."},
        {"role": "user", "content": GENERATE_INSTRUCTION},
    ]


async def test_a_missing_plan_gets_one_repair_then_fails(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        answer_turn("No plan"),
        add_tasks("p1", "Do a"),
        report("u1", "task_1", "completed", "ok"),
        answer_turn("Still no plan"),
        call_turn(("p2", "_plan_add_tasks_", '{"tasks": []}')),
    )
    async with tool_gateway(tmp_path, provider, {"p": planner()}) as gateway:
        repaired = await gateway.query("p", "Do a")
        failed = await gateway.query("p", "Do b")
    assert kinds(repaired)[3:9] == [*ANSWER, *CALL[:3]]
    assert "plan.create" in kinds(repaired) and repaired[-1].type == "run.complete"
    assert "call _plan_add_tasks_" in provider.requests[1]["messages"][-1]["content"]
    assert kinds(failed) == HEAD + ANSWER + CALL + ["run.error"]
    assert "invalid plan: 'tasks' must be a non-empty array" in result_of(failed[-2])
    error = failed[-1].run_error.error
    assert (error.reason, error.message) == (
        "PLAN_FAILED",
        "the model did not record a plan with _plan_add_tasks_",
    )


async def test_a_task_without_report_gets_one_forced_repair(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        add_tasks("p1", "Do a", "Do b"),
        answer_turn("I did a"),
        report("u1", "task_1", "completed", "a done"),
        answer_turn("I did b"),
        answer_turn("Really, b is done"),
    )
    async with tool_gateway(tmp_path, provider, {"p": planner()}) as gateway:
        events = await gateway.query("p", "Do a and b")
    assert kinds(events)[9:] == [
        "task.start",
        "plan.update",
        *ANSWER,
        *CALL,
        "task.complete",
        "plan.update",
        "task.start",
        "plan.update",
        *ANSWER,
        *ANSWER,
        "task.fail",
        "plan.update",
        "run.complete",
    ]
    forced = {"type": "function", "function": {"name": "_plan_update_task_"}}
    assert [r.get("tool_choice") for r in provider.requests[1:]] == [None, forced, None, forced]
    assert 'taskId "task_1"' in provider.requests[2]["messages"][-1]["content"]
    fail = events[-3].task_fail.error
    assert fail.reason == "TASK_NOT_REPORTED"


async def test_an_invalid_report_is_refused_and_repaired(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        add_tasks("p1", "Do a"),
        report("u1", "task_9", "completed", "wrong task"),
        report("u2", "task_1", "completed", "right"),
    )
    async with tool_gateway(tmp_path, provider, {"p": planner()}) as gateway:
        events = await gateway.query("p", "Do a")
    results = [result_of(e) for e in events if e.type == "tool.result"][1:]
    assert results == [
        "Error: invalid report: taskId must be the current task 'task_1' (got 'task_9')",
        "OK",
    ]
    assert events[-3].task_complete.description == "right"


async def test_a_budget_running_out_in_a_task_fails_the_task_then_the_run(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = {"p": planner(budget={"maxToolCalls": 1})}
    provider.enqueue(
        add_tasks("p1", "Do a"),
        call_turn(("c1", "echo", "{}")),
        call_turn(("c2", "echo", "{}")),
    )
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        events = await gateway.query("p", "Do a")
    assert kinds(events)[-12:] == [*CALL, *CALL[:4], "task.fail", "plan.update", "run.error"]
    fail = events[-3].task_fail.error
    assert fail.reason == "BUDGET_EXHAUSTED" and events[-3].task_id == "task_1"
    error = events[-1].run_error.error
    assert (error.reason, error.metadata["budget"]) == ("BUDGET_EXHAUSTED", "maxToolCalls")
    assert events[-1].task_id == ""
