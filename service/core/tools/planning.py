"""The fixed planning tools of PLAN_EXECUTE and the plan they build.

`_plan_add_tasks_` (plan stage) records the tasks; `_plan_update_task_` (execute
stage) reports one task done or failed; `_plan_decide_` (replan stage) continues,
revises or finishes the plan between tasks; `_plan_verify_` (verify stage) judges
the results. The mode handles their calls itself — they are never executed by
the tool executor — and they count toward no tool budget. `Plan` is the plan's
state as the `plan.*` events show it.

A task may name the tasks it depends on (`dependsOn`: task ids, or 1-based
positions in the same list), what it should produce (`expectedOutput`) and the
tools it needs (`requiredTools`). A dependency must come earlier, so a plan is
always a graph without cycles, and plan order is one valid order of it.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from service.core import events
from service.core.tools.definitions import ToolDefinition
from service.core.tools.names import (
    PLAN_ADD_TASKS_TOOL,
    PLAN_DECIDE_TOOL,
    PLAN_UPDATE_TASK_TOOL,
    PLAN_VERIFY_TOOL,
)

#: The line of an execute-stage brief that names the current task.
TASK_ID_LINE = "Current task id: "
#: The line of the summary stage's brief after which the tasks' results are listed.
RESULTS_HEADING = "The results of the plan's tasks:"
#: The heading under which the plan stage's system prompt lists the executors' tools.
EXECUTOR_TOOLS_HEADING = "## Tools available when the tasks are executed"

TASK_ITEM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "description": {"type": "string", "description": "What the task does."},
        "dependsOn": {
            "type": "array",
            "description": (
                "The tasks that must be completed before this one starts: task ids "
                '(e.g. "task_1") or 1-based positions in this list. Tasks that depend on '
                "nothing may run at the same time."
            ),
            "items": {"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 1}]},
        },
        "expectedOutput": {"type": "string", "description": "What the task's result holds."},
        "requiredTools": {
            "type": "array",
            "description": "The tools the task needs.",
            "items": {"type": "string"},
        },
    },
    "required": ["description"],
}

PLAN_ADD_TASKS = ToolDefinition(
    name=PLAN_ADD_TASKS_TOOL,
    kind="backend",
    description=(
        "Record the plan: the ordered list of tasks that together answer the user's request. "
        "Each task must be small enough to be done with at most one tool call per round."
    ),
    parameters={
        "type": "object",
        "properties": {"tasks": {"type": "array", "minItems": 1, "items": TASK_ITEM}},
        "required": ["tasks"],
    },
)

PLAN_UPDATE_TASK = ToolDefinition(
    name=PLAN_UPDATE_TASK_TOOL,
    kind="backend",
    description=(
        "Report the current task as completed (with its result) or failed (with the reason). "
        "Call it exactly once, when the task is done."
    ),
    parameters={
        "type": "object",
        "properties": {
            "taskId": {"type": "string", "description": "Id of the current task."},
            "status": {"type": "string", "enum": ["completed", "failed"]},
            "result": {"type": "string", "description": "The task's result, or why it failed."},
        },
        "required": ["taskId", "status", "result"],
    },
)

PLAN_DECIDE = ToolDefinition(
    name=PLAN_DECIDE_TOOL,
    kind="backend",
    description=(
        "Decide how the plan goes on: continue with the remaining tasks as they are, revise "
        "them (the given tasks replace every task not started yet), or finish now because "
        "the request is answered."
    ),
    parameters={
        "type": "object",
        "properties": {
            "decision": {"type": "string", "enum": ["continue", "revise", "finish"]},
            "reason": {"type": "string", "description": "Why, in one or two sentences."},
            "tasks": {
                "type": "array",
                "description": "With revise: the tasks replacing the remaining ones.",
                "items": TASK_ITEM,
            },
        },
        "required": ["decision", "reason"],
    },
)

PLAN_VERIFY = ToolDefinition(
    name=PLAN_VERIFY_TOOL,
    kind="backend",
    description=(
        "Give the verdict on the results of the plan's tasks against the user's request: pass, "
        "or needsMorePlanning with the improvements a further planning round must bring."
    ),
    parameters={
        "type": "object",
        "properties": {
            "verdict": {"type": "string", "enum": ["pass", "needsMorePlanning"]},
            "improvements": {
                "type": "array",
                "description": "With needsMorePlanning: what is missing or wrong, one per item.",
                "items": {"type": "string"},
            },
            "reason": {"type": "string", "description": "Why, in one or two sentences."},
        },
        "required": ["verdict"],
    },
)

PLANNING_DEFINITIONS = {
    d.name: d for d in (PLAN_ADD_TASKS, PLAN_UPDATE_TASK, PLAN_DECIDE, PLAN_VERIFY)
}

Status = Literal["init", "in_progress", "completed", "failed", "canceled"]
#: The statuses a task no longer leaves.
FINISHED: frozenset[Status] = frozenset({"completed", "failed", "canceled"})


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """A task as a planning call gives it; `depends_on` as given (ids or 1-based positions)."""

    description: str
    depends_on: tuple[str | int, ...] = ()
    expected_output: str = ""
    required_tools: tuple[str, ...] = ()


@dataclass(slots=True)
class Task:
    task_id: str
    description: str
    status: Status = "init"
    result: str = ""
    depends_on: tuple[str, ...] = ()  # ids of earlier tasks of the plan
    expected_output: str = ""
    required_tools: tuple[str, ...] = ()

    def listing(self) -> dict[str, Any]:
        """The task as a planning tool's result lists it."""
        listed: dict[str, Any] = {"taskId": self.task_id, "description": self.description}
        if self.depends_on:
            listed["dependsOn"] = list(self.depends_on)
        if self.expected_output:
            listed["expectedOutput"] = self.expected_output
        if self.required_tools:
            listed["requiredTools"] = list(self.required_tools)
        return listed


@dataclass(slots=True)
class Plan:
    plan_id: str = field(default_factory=lambda: "p_" + secrets.token_hex(4))
    tasks: list[Task] = field(default_factory=list)

    def add(
        self,
        specs: Sequence[TaskSpec],
        *,
        limit: int | None = None,
        tools: Collection[str] | None = None,
        replacing: Collection[str] = (),
    ) -> list[Task]:
        """Append the tasks of `specs` (numbered on from the plan's last task).

        Refused with `PlanningArgumentsError` (and the plan left unchanged) when there
        are more than `limit` tasks, a required tool is not among `tools`, or a
        dependency is not an earlier task; tasks in `replacing` cannot be depended on.
        """
        if limit is not None and len(specs) > limit:
            raise PlanningArgumentsError(
                f"too many tasks ({len(specs)}): a plan may have at most {limit}; merge some"
            )
        known = {t.task_id for t in self.tasks if t.task_id not in replacing}
        ids = [f"task_{len(self.tasks) + i + 1}" for i in range(len(specs))]
        added = []
        for index, spec in enumerate(specs):
            where = f"tasks[{index}]"
            unknown = [
                name for name in spec.required_tools if tools is not None and name not in tools
            ]
            if unknown:
                offered = ", ".join(sorted(tools or ())) or "none"
                raise PlanningArgumentsError(
                    f"{where}.requiredTools: no tool {', '.join(unknown)} (tools: {offered})"
                )
            depends = [_dependency(d, ids, index, known, where) for d in spec.depends_on]
            added.append(
                Task(
                    ids[index],
                    spec.description,
                    depends_on=tuple(dict.fromkeys(depends)),
                    expected_output=spec.expected_output,
                    required_tools=spec.required_tools,
                )
            )
            known.add(ids[index])
        self.tasks += added
        return added

    def revise(self, specs: Sequence[TaskSpec], **checks: Any) -> list[Task]:
        """Replace the tasks not started yet by those of `specs` (the old ones: canceled)."""
        remaining = [t for t in self.tasks if t.status == "init"]
        added = self.add(specs, replacing={t.task_id for t in remaining}, **checks)
        for task in remaining:
            task.status = "canceled"
        return added

    def task(self, task_id: str) -> Task:
        return next(t for t in self.tasks if t.task_id == task_id)

    @property
    def remaining(self) -> list[Task]:
        """The tasks not started yet, in plan order."""
        return [t for t in self.tasks if t.status == "init"]

    def to_pb(self) -> Any:
        """The plan as the contract's `Plan` message."""
        return events.plan([(t.task_id, t.description, t.status) for t in self.tasks])

    def outline(self) -> str:
        """The plan as lines of text, with dependencies, statuses and results so far."""
        lines = []
        for task in self.tasks:
            line = f"- {task.task_id} [{task.status}]: {task.description}"
            if task.depends_on:
                line += f" (after {', '.join(task.depends_on)})"
            if task.result:
                line += f" → {task.result}"
            lines.append(line)
        return "\n".join(lines)


def _dependency(given: str | int, ids: list[str], index: int, known: set[str], where: str) -> str:
    """The task id a dependency of task `index` of a planning call names."""
    if isinstance(given, int):
        if not 1 <= given <= index:
            raise PlanningArgumentsError(
                f"{where}.dependsOn: {given} is not the position of an earlier task in the list"
            )
        return ids[given - 1]
    if given not in known:
        earlier = ", ".join(sorted(known, key=_number)) or "none"
        raise PlanningArgumentsError(
            f"{where}.dependsOn: '{given}' is not an earlier task (earlier tasks: {earlier})"
        )
    return given


def _number(task_id: str) -> int:
    digits = task_id.rpartition("_")[2]
    return int(digits) if digits.isdigit() else 0


@dataclass(frozen=True, slots=True)
class TaskUpdate:
    task_id: str
    status: Literal["completed", "failed"]
    result: str


class PlanningArgumentsError(ValueError):
    """A planning tool was called with arguments that do not fit its schema."""


def _object(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        raise PlanningArgumentsError(f"arguments are not valid JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise PlanningArgumentsError("arguments must be a JSON object")
    return value


def parse_tasks(arguments: str) -> list[TaskSpec]:
    """The tasks of a `_plan_add_tasks_` call."""
    return _specs(_object(arguments).get("tasks"))


def _specs(tasks: Any) -> list[TaskSpec]:
    if not isinstance(tasks, list) or not tasks:
        raise PlanningArgumentsError("'tasks' must be a non-empty array")
    out: list[TaskSpec] = []
    for index, task in enumerate(tasks):
        where = f"tasks[{index}]"
        data = task if isinstance(task, dict) else {"description": task}
        text = data.get("description")
        if not isinstance(text, str) or not text.strip():
            raise PlanningArgumentsError(f"{where}.description must be a non-empty string")
        depends = data.get("dependsOn") or []
        if not isinstance(depends, list) or not all(_is_reference(d) for d in depends):
            raise PlanningArgumentsError(
                f"{where}.dependsOn must be an array of task ids or positions from 1"
            )
        expected = data.get("expectedOutput") or ""
        if not isinstance(expected, str):
            raise PlanningArgumentsError(f"{where}.expectedOutput must be a string")
        tools = data.get("requiredTools") or []
        if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
            raise PlanningArgumentsError(f"{where}.requiredTools must be an array of tool names")
        out.append(TaskSpec(text.strip(), tuple(depends), expected.strip(), tuple(tools)))
    return out


def _is_reference(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return (isinstance(value, int) and value >= 1) or (isinstance(value, str) and bool(value))


def parse_update(arguments: str, task_id: str) -> TaskUpdate:
    """The report of a `_plan_update_task_` call about the task `task_id`."""
    value = _object(arguments)
    given = value.get("taskId", task_id)
    if given != task_id:
        raise PlanningArgumentsError(f"taskId must be the current task '{task_id}' (got {given!r})")
    status = value.get("status")
    if status not in ("completed", "failed"):
        raise PlanningArgumentsError("status must be 'completed' or 'failed'")
    result = value.get("result", "")
    if not isinstance(result, str):
        result = json.dumps(result, ensure_ascii=False)
    return TaskUpdate(task_id, status, result)


@dataclass(frozen=True, slots=True)
class Decision:
    """A replanner's decision: go on, replace the remaining tasks, or stop executing."""

    kind: Literal["continue", "revise", "finish"]
    reason: str
    tasks: tuple[TaskSpec, ...] = ()


def parse_decision(arguments: str) -> Decision:
    """The decision of a `_plan_decide_` call."""
    value = _object(arguments)
    kind = value.get("decision")
    if kind not in ("continue", "revise", "finish"):
        raise PlanningArgumentsError("decision must be 'continue', 'revise' or 'finish'")
    reason = value.get("reason", "")
    if not isinstance(reason, str):
        raise PlanningArgumentsError("reason must be a string")
    if kind != "revise":
        return Decision(kind, reason.strip())
    return Decision(kind, reason.strip(), tuple(_specs(value.get("tasks"))))


@dataclass(frozen=True, slots=True)
class Verdict:
    """A verifier's verdict on the results of a plan."""

    passed: bool
    improvements: tuple[str, ...] = ()
    reason: str = ""


def parse_verdict(arguments: str) -> Verdict:
    """The verdict of a `_plan_verify_` call."""
    value = _object(arguments)
    verdict = value.get("verdict")
    if verdict not in ("pass", "needsMorePlanning"):
        raise PlanningArgumentsError("verdict must be 'pass' or 'needsMorePlanning'")
    reason = value.get("reason", "")
    if not isinstance(reason, str):
        raise PlanningArgumentsError("reason must be a string")
    improvements = value.get("improvements") or []
    if not isinstance(improvements, list) or not all(isinstance(i, str) for i in improvements):
        raise PlanningArgumentsError("improvements must be an array of strings")
    kept = tuple(i.strip() for i in improvements if i.strip())
    if verdict == "needsMorePlanning" and not kept:
        raise PlanningArgumentsError("needsMorePlanning needs at least one improvement")
    return Verdict(verdict == "pass", kept, reason.strip())
