"""PLAN_EXECUTE with a verifier: pass, or plan again with its improvements, at most N rounds."""

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
    plan_agent,
    plan_core,
    plan_turn,
    report_turn,
    run_query,
    statuses,
    verify_turn,
)
from tests.core.tools.kit import assert_invariants, kinds, result_of

VERIFY = {"systemPrompt": "Check the results."}
TASK = ["task.start", "plan.update", *CALL, "task.complete", "plan.update"]
ANSWERED = [*ANSWER, "run.complete"]


async def test_a_passing_verdict_goes_on_to_the_summary(tmp_path: Path) -> None:
    model = ScriptedModel()
    model.enqueue(
        plan_turn("p1", "Find a"),
        report_turn("u1", "task_1", "a"),
        verify_turn("v1", "pass"),
        answer_turn("It is a."),
    )
    async with plan_core(tmp_path, model, {"p": plan_agent(verify=VERIFY)}) as core:
        events = await run_query(core, "p", "Find a")
    assert kinds(events)[9:] == [*TASK, *CALL, *ANSWERED]
    assert result_of(events[-5]) == "OK" and events[-5].task_id == ""
    check = model.requests[2]
    assert (check.stage, check.tool_choice, check.reasoning.enabled) == (
        "verify",
        "required",
        False,
    )
    assert [t["function"]["name"] for t in check.tools] == ["_plan_verify_"]
    assert check.messages == [
        {"role": "system", "content": "Check the results."},
        {
            "role": "user",
            "content": "The user's request:\nFind a\n\n"
            "The results of the plan's tasks:\n- task_1 [completed]: Find a → a\n\n"
            "Judge whether these results answer the request fully and correctly, with "
            "_plan_verify_: verdict pass, or needsMorePlanning with the improvements needed.",
        },
    ]


async def test_needs_more_planning_plans_again_with_the_improvements(tmp_path: Path) -> None:
    model = ScriptedModel()
    model.enqueue(
        plan_turn("p1", "Find a"),
        report_turn("u1", "task_1", "a"),
        verify_turn("v1", "needsMorePlanning", "b is missing", "check a"),
        plan_turn("p2", "Find b", {"description": "Check a with b", "dependsOn": ["task_1", 1]}),
        report_turn("u2", "task_2", "b"),
        report_turn("u3", "task_3", "a holds"),
        verify_turn("v2", "pass"),
        answer_turn("a and b."),
    )
    async with plan_core(tmp_path, model, {"p": plan_agent(verify=VERIFY)}) as core:
        events = await run_query(core, "p", "Find a and b")
        await assert_replayed(core, events)
    assert kinds(events)[9:] == [
        *TASK,
        *CALL,  # the verdict
        *PLANNED,  # the second planning round
        "plan.revise",
        "tool.result",
        *TASK,
        *TASK,
        *CALL,  # the verdict
        *ANSWERED,
    ]
    assert_invariants(events)
    revise = next(e.plan_revise for e in events if e.type == "plan.revise")
    assert (revise.decision, revise.reason) == (pb.PLAN_DECISION_REVISE, "b is missing; check a")
    assert revise.plan_id == events[7].plan_create.plan_id  # the same plan goes on
    assert statuses(revise.plan) == [
        ("task_1", "COMPLETED"),
        ("task_2", "INIT"),
        ("task_3", "INIT"),
    ]
    assert [r.stage for r in model.requests] == [
        "plan",
        "execute",
        "verify",
        "plan",
        "execute",
        "execute",
        "verify",
        "summary",
    ]
    # the planner's conversation goes on: its first plan, then the results and improvements
    replanning = model.requests[3]
    assert [m["role"] for m in replanning.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "user",
    ]
    assert replanning.messages[-1]["content"] == (
        "The results of the plan's tasks:\n- task_1 [completed]: Find a → a\n\n"
        "A check of these results found that more work is needed:\n- b is missing\n- check a\n\n"
        "Plan the further tasks this needs and record them with _plan_add_tasks_: they are "
        "added to the plan, after its tasks so far (which they may depend on by id)."
    )
    second_check = model.requests[6]
    assert [m["role"] for m in second_check.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "user",
    ]
    assert (
        "- task_3 [completed]: Check a with b (after task_1, task_2) → a holds"
        in (second_check.messages[-1]["content"])
    )


async def test_after_the_last_round_the_open_points_go_to_the_summary(tmp_path: Path) -> None:
    model = ScriptedModel()
    model.enqueue(
        plan_turn("p1", "Find a"),
        report_turn("u1", "task_1", "a"),
        verify_turn("v1", "needsMorePlanning", "b is missing"),
        plan_turn("p2", "Find b"),
        report_turn("u2", "task_2", "no b", status="failed"),
        verify_turn("v2", "needsMorePlanning", "b is still missing"),
        answer_turn("Only a."),
    )
    agents = {"p": plan_agent(verify=VERIFY | {"maxRounds": 2})}
    async with plan_core(tmp_path, model, agents) as core:
        events = await run_query(core, "p", "Find a and b")
    assert kinds(events)[-9:] == [*CALL, *ANSWERED]
    assert [r.stage for r in model.requests].count("plan") == 2
    assert model.requests[-1].messages[1]["content"] == (
        "The user's request:\nFind a and b\n\n"
        "The results of the plan's tasks:\n"
        "- task_1 [completed]: Find a → a\n"
        "- task_2 [failed]: Find b → no b\n\n"
        "Points a check of these results found still open:\n- b is still missing\n\n"
        "Write the answer for the user."
    )


async def test_a_verifier_without_a_valid_verdict_is_asked_once_more(tmp_path: Path) -> None:
    model = ScriptedModel()
    model.enqueue(
        plan_turn("p1", "Find a"),
        report_turn("u1", "task_1", "a"),
        call_turn("v1", "_plan_verify_", {"verdict": "needsMorePlanning"}),
        answer_turn("Looks fine."),
        answer_turn("a."),
    )
    async with plan_core(tmp_path, model, {"p": plan_agent(verify=VERIFY)}) as core:
        events = await run_query(core, "p", "Find a")
    assert kinds(events)[9:] == [*TASK, *CALL, *ANSWER, *ANSWERED]
    assert result_of(events[-8]) == (
        "Error: invalid arguments: needsMorePlanning needs at least one improvement"
    )
    assert model.requests[3].messages[-1] == {
        "role": "user",
        "content": "You must give your verdict now: call _plan_verify_.",
    }
    assert [r.stage for r in model.requests] == ["plan", "execute", "verify", "verify", "summary"]


async def test_each_planning_round_waits_for_approval(tmp_path: Path) -> None:
    model = ScriptedModel()
    model.enqueue(
        plan_turn("p1", "Find a"),
        report_turn("u1", "task_1", "a"),
        verify_turn("v1", "needsMorePlanning", "b is missing"),
        plan_turn("p2", "Find b"),
        answer_turn("Only a."),
    )
    agents = {"p": plan_agent(plan={"approval": True}, verify=VERIFY)}
    async with plan_core(tmp_path, model, agents) as core:
        events = await run_query(core, "p", "Find a and b", approvals=[True, False])
    assert kinds(events)[3:] == [
        *PLANNED,
        "plan.create",
        "tool.result",
        "plan.approval",
        "request.submit",
        *TASK,
        *CALL,
        *PLANNED,
        "plan.revise",
        "tool.result",
        "plan.approval",
        "request.submit",  # refused: the new task is canceled, on to the summary
        "plan.update",
        *ANSWERED,
    ]
    assert statuses(events[-5].plan_update.plan) == [
        ("task_1", "COMPLETED"),
        ("task_2", "CANCELED"),
    ]
    assert events[-1].run_complete.finish_reason == "stop"
