"""PLAN_EXECUTE in parallel: a graph of dependencies, bounded concurrency, interleaved streams.

In-process, with a ScriptedModel; gates make the concurrent tasks interleave at
known points, so the event sequences are exact.
"""

from __future__ import annotations

from pathlib import Path

from service.testing import ScriptedModel
from tests.core.modes.plan_kit import (
    ANSWER,
    CALL,
    HEAD,
    PLANNED,
    Release,
    answer_turn,
    assert_replayed,
    call_turn,
    echo_turn,
    plan_agent,
    plan_core,
    plan_turn,
    report_turn,
    run_query,
    statuses,
    thinking,
)
from tests.core.tools.kit import assert_invariants, kinds, result_of

THINKING = ["reasoning.start", "reasoning.delta"]
JOIN = {"description": "Join a and b", "dependsOn": [1, 2], "expectedOutput": "a and b"}


async def test_independent_tasks_run_at_once_and_their_events_interleave(tmp_path: Path) -> None:
    model = ScriptedModel()
    b_thought = Release.when("reasoning.delta", "task_2")  # task_1 goes on once task_2 thinks
    a_done = Release.when("task.complete", "task_1")  # task_2 goes on once task_1 is done
    model.enqueue(
        plan_turn("p1", "Echo a", "Echo b", JOIN),
        thinking("A first", b_thought.gate, echo_turn("c1", "a")),
        thinking("B first", a_done.gate, echo_turn("c2", "b")),
        report_turn("u1", "task_1", "a echoed"),
        report_turn("u2", "task_2", "b echoed"),
        report_turn("u3", "task_3", "a and b joined"),
        answer_turn("Done."),
    )
    agents = {"p": plan_agent(execute={"parallel": 2})}
    async with plan_core(tmp_path, model, agents) as core:
        events = await run_query(core, "p", "Echo a and b, then join", b_thought, a_done)
        await assert_replayed(core, events)
    assert kinds(events) == [
        *HEAD,
        *PLANNED,
        "plan.create",
        "tool.result",
        "task.start",
        "plan.update",
        "task.start",
        "plan.update",
        *THINKING,  # task_1
        *THINKING,  # task_2
        "reasoning.end",  # task_1 from here
        *CALL,
        *CALL,
        "task.complete",
        "plan.update",
        "reasoning.end",  # task_2 from here
        *CALL,
        *CALL,
        "task.complete",
        "plan.update",
        "task.start",  # task_3, now that both are completed
        "plan.update",
        *CALL,
        "task.complete",
        "plan.update",
        *ANSWER,
        "run.complete",
    ]
    assert_invariants(events)
    assert [e.task_id for e in events] == [
        *[""] * 9,
        *["task_1"] * 2,
        *["task_2"] * 2,
        *["task_1"] * 2,
        *["task_2"] * 2,
        *["task_1"] * 13,
        *["task_2"] * 13,
        *["task_3"] * 9,
        *[""] * 4,
    ]
    run_id = events[0].run_id
    assert [e.reasoning_start.reasoning_id for e in events if e.type == "reasoning.start"] == [
        f"{run_id}_r_1",
        f"{run_id}_r_2",
    ]
    ends = [e for e in events if e.type == "reasoning.end"]
    assert [(e.task_id, e.reasoning_end.reasoning_id) for e in ends] == [
        ("task_1", f"{run_id}_r_1"),
        ("task_2", f"{run_id}_r_2"),
    ]
    assert result_of(events[8]) == {
        "planId": events[7].plan_create.plan_id,
        "tasks": [
            {"taskId": "task_1", "description": "Echo a"},
            {"taskId": "task_2", "description": "Echo b"},
            {
                "taskId": "task_3",
                "description": "Join a and b",
                "dependsOn": ["task_1", "task_2"],
                "expectedOutput": "a and b",
            },
        ],
    }
    assert statuses(events[12].plan_update.plan) == [
        ("task_1", "IN_PROGRESS"),
        ("task_2", "IN_PROGRESS"),
        ("task_3", "INIT"),
    ]
    assert statuses(events[-5].plan_update.plan) == [
        ("task_1", "COMPLETED"),
        ("task_2", "COMPLETED"),
        ("task_3", "COMPLETED"),
    ]

    _, task_1, task_2, task_1_report, task_2_report, task_3, summary = model.requests
    assert [r.stage for r in model.requests] == ["plan", *["execute"] * 5, "summary"]
    assert "Current task id: task_1\nYour task: Echo a\n\n" in task_1.messages[1]["content"]
    assert "Current task id: task_2\nYour task: Echo b\n\n" in task_2.messages[1]["content"]
    # each task has its own conversation: the brief, its own calls and their results
    assert [m["role"] for m in task_2_report.messages] == ["system", "user", "assistant", "tool"]
    assert task_2_report.messages[3]["content"] == '{"echo": "b", "taskId": "task_2"}'
    brief_3 = task_3.messages[1]["content"]
    assert (
        "- task_1 [completed]: Echo a → a echoed\n"
        "- task_2 [completed]: Echo b → b echoed\n"
        "- task_3 [in_progress]: Join a and b (after task_1, task_2)\n"
    ) in brief_3
    assert "Your task: Join a and b\nExpected output: a and b\n\nWhen" in brief_3
    # the results reach the summary in plan order, whatever order they ended in
    assert "- task_1 [completed]: Echo a → a echoed\n- task_2" in summary.messages[1]["content"]
    assert task_1_report.messages[1] == task_1.messages[1]


async def test_at_most_parallel_tasks_run_at_once_in_plan_order(tmp_path: Path) -> None:
    model = ScriptedModel()
    third_started = Release.when("task.start", "task_3")  # task_2 reports once task_3 runs
    model.enqueue(
        plan_turn("p1", "One", "Two", "Three"),
        report_turn("u1", "task_1", "1"),
        [third_started.gate, *report_turn("u2", "task_2", "2")],
        report_turn("u3", "task_3", "3"),
    )
    agents = {"p": plan_agent(summary=False, execute={"parallel": 2})}
    async with plan_core(tmp_path, model, agents) as core:
        events = await run_query(core, "p", "Three things", third_started)
    started = [(e.type, e.task_id) for e in events if e.type.startswith("task.")]
    assert started == [
        ("task.start", "task_1"),
        ("task.start", "task_2"),
        ("task.complete", "task_1"),
        ("task.start", "task_3"),  # task_1's slot is free; task_2 still runs
        ("task.complete", "task_3"),
        ("task.complete", "task_2"),
    ]
    assert events[-1].type == "run.complete"
    assert_invariants(events)


async def test_a_failed_task_skips_its_dependents_and_the_others_go_on(tmp_path: Path) -> None:
    model = ScriptedModel()
    model.enqueue(
        plan_turn(
            "p1",
            "Echo a",
            {"description": "Use a", "dependsOn": ["task_1"]},
            "Echo b",
            {"description": "Use what used a", "dependsOn": [2]},
        ),
        report_turn("u1", "task_1", "no a", status="failed"),
        report_turn("u3", "task_3", "b echoed"),
        answer_turn("Only b."),
    )
    agents = {"p": plan_agent(execute={"parallel": 3})}
    async with plan_core(tmp_path, model, agents) as core:
        events = await run_query(core, "p", "a, then b")
        await assert_replayed(core, events)
    assert kinds(events)[9:] == [
        "task.start",
        "plan.update",
        "task.start",
        "plan.update",
        *CALL,
        "task.fail",
        "plan.update",
        *CALL,
        "task.complete",
        "plan.update",
        "plan.update",  # task_2 and task_4 skipped: never started
        *ANSWER,
        "run.complete",
    ]
    assert [e.task_id for e in events if e.type.startswith("task.")] == [
        "task_1",
        "task_3",
        "task_1",
        "task_3",
    ]
    skipped = events[27]
    assert skipped.task_id == ""
    assert statuses(skipped.plan_update.plan) == [
        ("task_1", "FAILED"),
        ("task_2", "CANCELED"),
        ("task_3", "COMPLETED"),
        ("task_4", "CANCELED"),
    ]
    assert (events[18].task_fail.error.reason, events[18].task_fail.error.message) == (
        "TASK_FAILED",
        "no a",
    )
    assert (
        model.requests[-1]
        .messages[1]["content"]
        .endswith(
            "- task_1 [failed]: Echo a → no a\n"
            "- task_2 [canceled]: Use a (after task_1) → skipped: task_1 failed\n"
            "- task_3 [completed]: Echo b → b echoed\n"
            "- task_4 [canceled]: Use what used a (after task_2) → skipped: task_2 was canceled\n\n"
            "Write the answer for the user."
        )
    )
    assert_invariants(events)


async def test_one_at_a_time_a_failure_skips_the_dependents_too(tmp_path: Path) -> None:
    model = ScriptedModel()
    model.enqueue(
        plan_turn("p1", "Echo a", {"description": "Use a", "dependsOn": [1]}, "Echo b"),
        report_turn("u1", "task_1", "no a", status="failed"),
        report_turn("u3", "task_3", "b"),
    )
    agents = {"p": plan_agent(summary=False)}
    async with plan_core(tmp_path, model, agents) as core:
        events = await run_query(core, "p", "a, then b")
    assert kinds(events)[9:] == [
        "task.start",
        "plan.update",
        *CALL,
        "task.fail",
        "plan.update",
        "plan.update",
        "task.start",
        "plan.update",
        *CALL,
        "task.complete",
        "plan.update",
        "run.complete",
    ]
    assert statuses(events[-2].plan_update.plan) == [
        ("task_1", "FAILED"),
        ("task_2", "CANCELED"),
        ("task_3", "COMPLETED"),
    ]


async def test_plans_over_max_tasks_and_wrong_dependencies_are_refused_then_repaired(
    tmp_path: Path,
) -> None:
    model = ScriptedModel()
    model.enqueue(
        plan_turn("p1", "One", "Two", "Three"),
        plan_turn("p2", {"description": "One", "dependsOn": [1]}),
        plan_turn("p3", "One", {"description": "Two", "requiredTools": ["echo", "web"]}),
        plan_turn("p4", {"description": "One", "dependsOn": ["task_9"]}),
    )
    agents = {"p": plan_agent(plan={"maxTasks": 2})}
    async with plan_core(tmp_path, model, agents) as core:
        too_many = await run_query(core, "p", "Three things")
        wrong = await run_query(core, "p", "Anything")
    refusals = [result_of(e) for e in too_many + wrong if e.type == "tool.result"]
    assert refusals == [
        "Error: invalid plan: too many tasks (3): a plan may have at most 2; merge some",
        "Error: invalid plan: tasks[0].dependsOn: 1 is not the position of an earlier task "
        "in the list",
        "Error: invalid plan: tasks[1].requiredTools: no tool web (tools: boom, echo)",
        "Error: invalid plan: tasks[0].dependsOn: 'task_9' is not an earlier task "
        "(earlier tasks: none)",
    ]
    assert [e.run_error.error.reason for e in too_many + wrong if e.type == "run.error"] == [
        "PLAN_FAILED",
        "PLAN_FAILED",
    ]


async def test_a_task_out_of_rounds_is_asked_for_its_report(tmp_path: Path) -> None:
    model = ScriptedModel()
    model.enqueue(
        plan_turn("p1", "Echo twice"),
        echo_turn("c1", "a"),
        echo_turn("c2", "b"),
        report_turn("u1", "task_1", "twice"),
    )
    agents = {"p": plan_agent(summary=False, execute={"maxRounds": 2})}
    async with plan_core(tmp_path, model, agents) as core:
        events = await run_query(core, "p", "Echo")
    assert kinds(events)[9:] == [
        "task.start",
        "plan.update",
        *CALL,
        *CALL,
        *CALL,
        "task.complete",
        "plan.update",
        "run.complete",
    ]
    forced = {"type": "function", "function": {"name": "_plan_update_task_"}}
    assert [r.tool_choice for r in model.requests[1:]] == [None, None, forced]
    assert model.requests[-1].messages[-1] == {
        "role": "user",
        "content": "This task has used its 2 tool rounds. Call _plan_update_task_ now with taskId "
        '"task_1": status "completed" and the result so far, or "failed" and the reason.',
    }


async def test_an_error_in_one_task_stops_the_others_and_ends_the_run(tmp_path: Path) -> None:
    model = ScriptedModel()
    b_called = Release.when("tool.end", "task_2")
    never = Release.when("run.complete")
    model.enqueue(
        plan_turn("p1", "Echo a", "Echo b"),
        echo_turn("c1", "a", gate=b_called.gate),
        echo_turn("c2", "b"),
        [*report_turn("u2", "task_2", "b")[:1], never.gate],
    )
    agents = {
        "p": plan_agent(summary=False, execute={"parallel": 2}) | {"budget": {"maxToolCalls": 1}}
    }
    async with plan_core(tmp_path, model, agents) as core:
        events = await run_query(core, "p", "a and b", b_called)
        await assert_replayed(core, events)
    assert kinds(events)[9:] == [
        "task.start",
        "plan.update",
        "task.start",
        "plan.update",
        "tool.start",  # task_1's call waits at its gate
        "tool.args",
        *CALL,  # task_2's call uses the only tool call of the budget
        "tool.start",  # task_2's report, still streaming
        "tool.args",
        "tool.args",  # task_1 again: its call is over the budget
        "tool.end",
        "task.fail",
        "plan.update",
        "plan.update",  # task_2, stopped with the run: canceled
        "tool.end",  # task_2's report, closed when the run ends
        "run.error",
    ]
    assert [e.task_id for e in events[13:-1]] == [
        *["task_1"] * 2,
        *["task_2"] * 7,
        *["task_1"] * 4,
        *["task_2"] * 2,
    ]
    assert events[-5].task_fail.error.reason == "BUDGET_EXHAUSTED"
    assert statuses(events[-4].plan_update.plan) == [
        ("task_1", "FAILED"),
        ("task_2", "IN_PROGRESS"),
    ]
    assert statuses(events[-3].plan_update.plan) == [
        ("task_1", "FAILED"),
        ("task_2", "CANCELED"),
    ]
    assert events[-1].run_error.error.metadata["budget"] == "maxToolCalls"
    assert all(call.closed for call in model.calls)
    assert_invariants(events)


async def test_cancelling_the_run_cancels_every_running_task(tmp_path: Path) -> None:
    model = ScriptedModel()
    never = Release.when("run.complete")
    model.enqueue(
        plan_turn("p1", "Echo a", "Echo b"),
        call_turn("c1", "echo", {"text": "a"}, gate=never.gate),
        call_turn("c2", "echo", {"text": "b"}, gate=never.gate),
    )
    agents = {"p": plan_agent(summary=False, execute={"parallel": 2})}
    async with plan_core(tmp_path, model, agents) as core:
        events = await run_query(core, "p", "a and b", cancel_after=17)
        await assert_replayed(core, events)
    assert kinds(events)[9:] == [
        "task.start",
        "plan.update",
        "task.start",
        "plan.update",
        "tool.start",
        "tool.args",
        "tool.start",
        "tool.args",
        "plan.update",  # each running task ends canceled, and the plan says so
        "plan.update",
        "tool.end",  # closed when the run ends
        "tool.end",
        "run.cancel",
    ]
    assert [e.task_id for e in events[-5:]] == ["task_1", "task_2", "task_2", "task_1", ""]
    assert statuses(events[-4].plan_update.plan) == [
        ("task_1", "CANCELED"),
        ("task_2", "CANCELED"),
    ]
    assert [(c.finished, c.closed) for c in model.calls[1:]] == [(False, True), (False, True)]
    assert_invariants(events)
