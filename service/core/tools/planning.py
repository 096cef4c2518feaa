"""The fixed planning tools of PLAN_EXECUTE and the plan they build.

`_plan_add_tasks_` (plan stage) records the tasks; `_plan_update_task_` (execute
stage) reports one task done or failed. The mode handles their calls itself —
they are never executed by the tool executor — and they count toward no tool
budget. `Plan` is the plan's state as the `plan.*` events show it.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

from service.core import events
from service.core.agents import PLAN_ADD_TASKS_TOOL, PLAN_UPDATE_TASK_TOOL
from service.core.tools.definitions import ToolDefinition

#: The line of an execute-stage brief that names the current task.
TASK_ID_LINE = "Current task id: "
#: The line of the summary stage's brief after which the tasks' results are listed.
RESULTS_HEADING = "The results of the plan's tasks:"
#: The heading under which the plan stage's system prompt lists the executors' tools.
EXECUTOR_TOOLS_HEADING = "## Tools available when the tasks are executed"

PLAN_ADD_TASKS = ToolDefinition(
    name=PLAN_ADD_TASKS_TOOL,
    kind="backend",
    description=(
        "Record the plan: the ordered list of tasks that together answer the user's request. "
        "Each task must be small enough to be done with at most one tool call per round."
    ),
    parameters={
        "type": "object",
        "properties": {
            "tasks": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {
                        "description": {"type": "string", "description": "What the task does."}
                    },
                    "required": ["description"],
                },
            }
        },
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

PLANNING_DEFINITIONS = {d.name: d for d in (PLAN_ADD_TASKS, PLAN_UPDATE_TASK)}

Status = Literal["init", "in_progress", "completed", "failed", "canceled"]


@dataclass(slots=True)
class Task:
    task_id: str
    description: str
    status: Status = "init"
    result: str = ""


@dataclass(slots=True)
class Plan:
    plan_id: str = field(default_factory=lambda: "p_" + secrets.token_hex(4))
    tasks: list[Task] = field(default_factory=list)

    def add(self, descriptions: list[str]) -> list[Task]:
        added = [Task(f"task_{len(self.tasks) + i + 1}", d) for i, d in enumerate(descriptions)]
        self.tasks += added
        return added

    def to_pb(self) -> Any:
        """The plan as the contract's `Plan` message."""
        return events.plan([(t.task_id, t.description, t.status) for t in self.tasks])

    def outline(self) -> str:
        """The plan as lines of text, with statuses and results so far."""
        lines = []
        for task in self.tasks:
            line = f"- {task.task_id} [{task.status}]: {task.description}"
            if task.result:
                line += f" → {task.result}"
            lines.append(line)
        return "\n".join(lines)


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


def parse_tasks(arguments: str) -> list[str]:
    """The task descriptions of a `_plan_add_tasks_` call."""
    tasks = _object(arguments).get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise PlanningArgumentsError("'tasks' must be a non-empty array")
    out: list[str] = []
    for index, task in enumerate(tasks):
        text = task.get("description") if isinstance(task, dict) else task
        if not isinstance(text, str) or not text.strip():
            raise PlanningArgumentsError(f"tasks[{index}].description must be a non-empty string")
        out.append(text.strip())
    return out


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
