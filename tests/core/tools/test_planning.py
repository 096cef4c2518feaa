"""The planning tools' arguments and the plan they build: dependencies, caps, revisions."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.core.tools.planning import (
    PLANNING_DEFINITIONS,
    Decision,
    Plan,
    PlanningArgumentsError,
    TaskSpec,
    Verdict,
    parse_decision,
    parse_tasks,
    parse_verdict,
)


def args(**fields: Any) -> str:
    return json.dumps(fields)


def test_the_four_planning_tools_and_their_required_arguments() -> None:
    required = {name: d.parameters["required"] for name, d in PLANNING_DEFINITIONS.items()}
    assert required == {
        "_plan_add_tasks_": ["tasks"],
        "_plan_update_task_": ["taskId", "status", "result"],
        "_plan_decide_": ["decision", "reason"],
        "_plan_verify_": ["verdict"],
    }
    item = PLANNING_DEFINITIONS["_plan_add_tasks_"].parameters["properties"]["tasks"]["items"]
    assert list(item["properties"]) == [
        "description",
        "dependsOn",
        "expectedOutput",
        "requiredTools",
    ]


def test_tasks_with_their_dependencies_expected_output_and_tools() -> None:
    specs = parse_tasks(
        args(
            tasks=[
                {"description": " Find a "},
                "Find b",
                {
                    "description": "Join",
                    "dependsOn": [1, "task_2"],
                    "expectedOutput": " a and b ",
                    "requiredTools": ["echo"],
                },
            ]
        )
    )
    assert specs == [
        TaskSpec("Find a"),
        TaskSpec("Find b"),
        TaskSpec("Join", (1, "task_2"), "a and b", ("echo",)),
    ]
    plan = Plan()
    tasks = plan.add(specs, limit=3, tools={"echo"})
    assert [(t.task_id, t.depends_on) for t in tasks] == [
        ("task_1", ()),
        ("task_2", ()),
        ("task_3", ("task_1", "task_2")),
    ]
    assert tasks[2].listing() == {
        "taskId": "task_3",
        "description": "Join",
        "dependsOn": ["task_1", "task_2"],
        "expectedOutput": "a and b",
        "requiredTools": ["echo"],
    }
    assert plan.outline() == (
        "- task_1 [init]: Find a\n"
        "- task_2 [init]: Find b\n"
        "- task_3 [init]: Join (after task_1, task_2)"
    )


@pytest.mark.parametrize(
    ("tasks", "message"),
    [
        ([], "'tasks' must be a non-empty array"),
        ([{"description": " "}], r"tasks\[0\].description must be a non-empty string"),
        ([{"description": "a", "dependsOn": "task_1"}], r"tasks\[0\].dependsOn must be an array"),
        ([{"description": "a", "dependsOn": [0]}], r"tasks\[0\].dependsOn must be an array"),
        ([{"description": "a", "dependsOn": [True]}], r"tasks\[0\].dependsOn must be an array"),
        ([{"description": "a", "expectedOutput": 1}], r"tasks\[0\].expectedOutput must be"),
        ([{"description": "a", "requiredTools": "echo"}], r"tasks\[0\].requiredTools must be"),
    ],
)
def test_malformed_tasks_are_refused_with_where_and_why(tasks: Any, message: str) -> None:
    with pytest.raises(PlanningArgumentsError, match=message):
        parse_tasks(args(tasks=tasks))


@pytest.mark.parametrize(
    ("specs", "checks", "message"),
    [
        ([TaskSpec("a")] * 3, {"limit": 2}, r"too many tasks \(3\): a plan may have at most 2"),
        ([TaskSpec("a", (1,))], {}, "1 is not the position of an earlier task in the list"),
        ([TaskSpec("a"), TaskSpec("b", (3,))], {}, r"tasks\[1\].dependsOn: 3 is not"),
        ([TaskSpec("a", ("task_1",))], {}, r"'task_1' is not an earlier task \(earlier tasks"),
        ([TaskSpec("a", (), "", ("web",))], {"tools": {"echo"}}, "no tool web .tools: echo."),
    ],
)
def test_plans_that_cannot_run_are_refused_and_leave_the_plan_unchanged(
    specs: list[TaskSpec], checks: dict[str, Any], message: str
) -> None:
    plan = Plan()
    with pytest.raises(PlanningArgumentsError, match=message):
        plan.add(specs, **checks)
    assert plan.tasks == []


def test_a_revision_replaces_the_tasks_not_started_and_numbers_on() -> None:
    plan = Plan()
    plan.add([TaskSpec("a"), TaskSpec("b"), TaskSpec("c", (2,))])
    plan.tasks[0].status, plan.tasks[1].status = "completed", "in_progress"
    with pytest.raises(PlanningArgumentsError, match="'task_3' is not an earlier task"):
        plan.revise([TaskSpec("d", ("task_3",))])  # task_3 is being replaced
    assert [t.status for t in plan.tasks] == ["completed", "in_progress", "init"]
    added = plan.revise([TaskSpec("d", ("task_1",)), TaskSpec("e", (1, "task_2"))])
    assert [(t.task_id, t.depends_on) for t in added] == [
        ("task_4", ("task_1",)),
        ("task_5", ("task_4", "task_2")),
    ]
    assert [(t.task_id, t.status) for t in plan.tasks] == [
        ("task_1", "completed"),
        ("task_2", "in_progress"),
        ("task_3", "canceled"),
        ("task_4", "init"),
        ("task_5", "init"),
    ]
    assert [t.task_id for t in plan.remaining] == ["task_4", "task_5"]


def test_decisions() -> None:
    assert parse_decision(args(decision="continue", reason=" ok ")) == Decision("continue", "ok")
    assert parse_decision(args(decision="finish", reason="done", tasks=[])) == Decision(
        "finish", "done"
    )
    revise = parse_decision(args(decision="revise", reason="r", tasks=["x"]))
    assert revise == Decision("revise", "r", (TaskSpec("x"),))
    for bad, message in [
        (args(decision="stop", reason="r"), "decision must be 'continue', 'revise' or 'finish'"),
        (args(decision="revise", reason="r"), "'tasks' must be a non-empty array"),
        (args(decision="continue", reason=1), "reason must be a string"),
        ("[]", "arguments must be a JSON object"),
    ]:
        with pytest.raises(PlanningArgumentsError, match=message):
            parse_decision(bad)


def test_verdicts() -> None:
    assert parse_verdict(args(verdict="pass")) == Verdict(True)
    assert parse_verdict(
        args(verdict="needsMorePlanning", improvements=[" b ", " "], reason="why")
    ) == Verdict(False, ("b",), "why")
    for bad, message in [
        (args(verdict="maybe"), "verdict must be 'pass' or 'needsMorePlanning'"),
        (args(verdict="needsMorePlanning"), "needsMorePlanning needs at least one improvement"),
        (args(verdict="pass", improvements="x"), "improvements must be an array of strings"),
        ("{", "arguments are not valid JSON"),
    ]:
        with pytest.raises(PlanningArgumentsError, match=message):
            parse_verdict(bad)
