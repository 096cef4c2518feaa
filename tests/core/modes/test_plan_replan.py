"""PLAN_EXECUTE with a replanner: continue / revise / finish after each task or wave."""

from __future__ import annotations

from pathlib import Path

from agw.v1 import events_pb2 as pb

from service.testing import ScriptedModel
from tests.core.modes.plan_kit import (
    ANSWER,
    CALL,
    PLANNED,
    answer_turn,
    assert_replayed,
    call_turn,
    decide_turn,
    plan_agent,
    plan_core,
    plan_turn,
    report_turn,
    run_query,
    statuses,
)
from tests.core.tools.kit import assert_invariants, kinds, result_of

REPLAN = {"systemPrompt": "Review the plan."}
TASK = ["task.start", "plan.update", *CALL, "task.complete", "plan.update"]
DECIDED = [*PLANNED, "plan.revise", "tool.result"]


async def test_the_replanner_continues_revises_then_finishes(tmp_path: Path) -> None:
    model = ScriptedModel()
    model.enqueue(
        plan_turn("p1", "Find a", "Find b", "Find c"),
        report_turn("u1", "task_1", "a found"),
        decide_turn("d1", "continue", "On track."),
        report_turn("u2", "task_2", "no b, but d"),
        decide_turn(
            "d2",
            "revise",
            "b is gone; use d.",
            "Use d",
            {"description": "Check d against a", "dependsOn": ["task_1", 1]},
        ),
        report_turn("u4", "task_4", "d used"),
        decide_turn("d3", "finish", "That answers it."),
        answer_turn("Done."),
    )
    agents = {"p": plan_agent(replan=REPLAN)}
    async with plan_core(tmp_path, model, agents) as core:
        events = await run_query(core, "p", "Find a, b and c")
        await assert_replayed(core, events)
    assert kinds(events)[3:] == [
        *PLANNED,
        "plan.create",
        "tool.result",
        *TASK,
        *DECIDED,
        *TASK,
        *DECIDED,
        *TASK,
        *DECIDED,
        *ANSWER,
        "run.complete",
    ]
    assert_invariants(events)
    revisions = [e.plan_revise for e in events if e.type == "plan.revise"]
    assert [(r.decision, r.reason) for r in revisions] == [
        (pb.PLAN_DECISION_CONTINUE, "On track."),
        (pb.PLAN_DECISION_REVISE, "b is gone; use d."),
        (pb.PLAN_DECISION_FINISH, "That answers it."),
    ]
    assert statuses(revisions[1].plan) == [
        ("task_1", "COMPLETED"),
        ("task_2", "COMPLETED"),
        ("task_3", "CANCELED"),  # replaced
        ("task_4", "INIT"),
        ("task_5", "INIT"),
    ]
    assert statuses(revisions[2].plan)[3:] == [("task_4", "COMPLETED"), ("task_5", "CANCELED")]
    assert [e.task_id for e in events if e.type == "plan.revise"] == ["", "", ""]
    decided = [result_of(e) for e in events if e.type == "tool.result"][2::2]
    assert decided == [
        "OK",
        {
            "planId": revisions[1].plan_id,
            "tasks": [
                {"taskId": "task_4", "description": "Use d"},
                {
                    "taskId": "task_5",
                    "description": "Check d against a",
                    "dependsOn": ["task_1", "task_4"],
                },
            ],
        },
        "OK",
    ]

    replans = [r for r in model.requests if r.stage == "replan"]
    assert len(replans) == 3
    assert all(r.tool_choice == "required" and not r.reasoning.enabled for r in replans)
    assert all([t["function"]["name"] for t in r.tools] == ["_plan_decide_"] for r in replans)
    first, _, last = replans
    assert first.messages[0] == {"role": "system", "content": "Review the plan."}
    assert first.messages[1]["content"] == (
        "The user's request:\nFind a, b and c\n\n"
        "The plan, with the results so far:\n"
        "- task_1 [completed]: Find a → a found\n"
        "- task_2 [init]: Find b\n"
        "- task_3 [init]: Find c\n\n"
        "Tasks that just ended: task_1\n\n"
        "Decide how the plan goes on with _plan_decide_: continue with the remaining tasks, "
        "revise them (your tasks replace every task not started yet), or finish if the "
        "request is answered already."
    )
    # one conversation for the run: the earlier decisions stay in it
    assert [m["role"] for m in last.messages] == [
        "system",
        *["user", "assistant", "tool"] * 2,
        "user",
    ]
    assert (
        "- task_5 [init]: Check d against a (after task_1, task_4)" in last.messages[-1]["content"]
    )
    summary = model.requests[-1].messages[1]["content"]
    assert "- task_3 [canceled]: Find c\n" in summary
    assert "- task_5 [canceled]: Check d against a (after task_1, task_4)\n" in summary


async def test_no_replanner_call_when_no_task_remains(tmp_path: Path) -> None:
    model = ScriptedModel()
    model.enqueue(
        plan_turn("p1", "Find a", "Find b"),
        report_turn("u1", "task_1", "a"),
        decide_turn("d1", "continue", "Fine."),
        report_turn("u2", "task_2", "b"),
    )
    agents = {"p": plan_agent(summary=False, replan=REPLAN)}
    async with plan_core(tmp_path, model, agents) as core:
        events = await run_query(core, "p", "a and b")
    assert kinds(events)[9:] == [*TASK, *DECIDED, *TASK, "run.complete"]
    assert [r.stage for r in model.requests] == ["plan", "execute", "replan", "execute"]


async def test_only_after_failure_the_replanner_revises_the_blocked_tasks(tmp_path: Path) -> None:
    model = ScriptedModel()
    model.enqueue(
        plan_turn("p1", "Find a", "Find b", {"description": "Use b", "dependsOn": [2]}),
        report_turn("u1", "task_1", "a"),
        report_turn("u2", "task_2", "no b", status="failed"),
        decide_turn("d1", "revise", "Work around b.", "Use a instead"),
        report_turn("u4", "task_4", "a used"),
    )
    agents = {"p": plan_agent(summary=False, replan=REPLAN | {"onlyAfterFailure": True})}
    async with plan_core(tmp_path, model, agents) as core:
        events = await run_query(core, "p", "a and b")
    assert kinds(events)[9:] == [
        *TASK,
        "task.start",
        "plan.update",
        *CALL,
        "task.fail",
        "plan.update",
        *DECIDED,
        *TASK,
        "run.complete",
    ]
    assert [r.stage for r in model.requests] == ["plan", *["execute"] * 2, "replan", "execute"]
    assert statuses(events[-2].plan_update.plan) == [
        ("task_1", "COMPLETED"),
        ("task_2", "FAILED"),
        ("task_3", "CANCELED"),
        ("task_4", "COMPLETED"),
    ]


async def test_an_invalid_decision_is_refused_once_then_the_plan_continues(
    tmp_path: Path,
) -> None:
    model = ScriptedModel()
    model.enqueue(
        plan_turn("p1", "Find a", "Find b"),
        report_turn("u1", "task_1", "a"),
        call_turn("d1", "_plan_decide_", {"decision": "revise", "reason": "Hm."}),
        call_turn("d2", "_plan_decide_", {"decision": "pause", "reason": "Hm."}),
        report_turn("u2", "task_2", "b"),
    )
    agents = {"p": plan_agent(summary=False, replan=REPLAN)}
    async with plan_core(tmp_path, model, agents) as core:
        events = await run_query(core, "p", "a and b")
    assert kinds(events)[9:] == [*TASK, *CALL, *CALL, *TASK, "run.complete"]
    refusals = [result_of(e) for e in events if e.type == "tool.result"][2:4]
    assert refusals == [
        "Error: invalid arguments: 'tasks' must be a non-empty array",
        "Error: invalid arguments: decision must be 'continue', 'revise' or 'finish'",
    ]
    repair = model.requests[3].messages[-1]
    assert repair == {
        "role": "user",
        "content": "You must decide now: call _plan_decide_ with a decision and its reason.",
    }


async def test_with_parallel_tasks_the_replanner_decides_after_each_wave(tmp_path: Path) -> None:
    model = ScriptedModel()
    model.enqueue(
        plan_turn("p1", "One", "Two", "Three"),
        report_turn("u1", "task_1", "1"),
        report_turn("u2", "task_2", "2"),
        decide_turn("d1", "continue", "Go on."),
        report_turn("u3", "task_3", "3"),
    )
    agents = {"p": plan_agent(summary=False, execute={"parallel": 2}, replan=REPLAN)}
    async with plan_core(tmp_path, model, agents) as core:
        events = await run_query(core, "p", "Three things")
        await assert_replayed(core, events)
    assert kinds(events)[9:] == [
        "task.start",
        "plan.update",
        "task.start",
        "plan.update",
        *CALL,
        "task.complete",
        "plan.update",
        *CALL,
        "task.complete",
        "plan.update",
        *DECIDED,  # after the wave of task_1 and task_2
        *TASK,
        "run.complete",
    ]
    assert "Tasks that just ended: task_1, task_2\n" in model.requests[3].messages[1]["content"]
