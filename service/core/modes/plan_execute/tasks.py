"""One plan task of PLAN_EXECUTE, from `task.start` to `task.complete` or `task.fail`.

Every event of a task carries its `taskId`: the task works in its own scope
(`ctx.for_task`) and in its own conversation, opened with a brief — the request,
the plan as it stands when the task starts (with the results so far), the task,
what it should produce and the tools it needs. The task makes rounds of at most
one tool call each until the model reports it with `_plan_update_task_`. A model
that answers without reporting gets one repair attempt (a forced call); a task
that has used `planExecute.execute.maxRounds` tool rounds is asked for its report
the same way. Then `task.complete` or `task.fail`, each followed by `plan.update`.

An error of the run (a budget, the provider) fails the task, then ends the run.
"""

from __future__ import annotations

import asyncio
from typing import Any

from service.core import events
from service.core.errors import TASK_FAILED, TASK_NOT_REPORTED, AgwError
from service.core.run.context import RunContext, RunStopped
from service.core.run.executor import ToolOutcome
from service.core.run.loop import Conversation
from service.core.run.results import ToolCall
from service.core.tools.names import PLAN_UPDATE_TASK_TOOL
from service.core.tools.planning import (
    TASK_ID_LINE,
    Plan,
    PlanningArgumentsError,
    Task,
    TaskUpdate,
    parse_update,
)

UPDATE_REPAIR = (
    "You have not reported the task. Call " + PLAN_UPDATE_TASK_TOOL + " now with taskId "
    '"{task_id}", status "completed" and the result, or status "failed" and the reason.'
)
ROUNDS_USED = (
    "This task has used its {rounds} tool rounds. Call " + PLAN_UPDATE_TASK_TOOL + " now with "
    'taskId "{task_id}": status "completed" and the result so far, or "failed" and the reason.'
)
NO_MORE_ROUNDS = "not executed: this task has no tool rounds left; report it now"


def begin(ctx: RunContext, plan: Plan, task: Task) -> RunContext:
    """Start `task`: `task.start`, then `plan.update`; the task's scope of the run."""
    scoped = ctx.for_task(task.task_id)
    task.status = "in_progress"
    scoped.out.emit(events.task_start(task.task_id, task.description))
    scoped.out.emit(events.plan_update(plan.plan_id, plan.to_pb()))
    return scoped


async def execute_task(ctx: RunContext, plan: Plan, task: Task) -> None:
    """Run the started `task` (in its scope `ctx`) to its report, then end it."""
    stage = ctx.agent.stage("execute")
    try:
        opening = await journaled_brief(ctx, plan, task)
        conversation = Conversation.open(ctx, stage, opening, history=False)
        update = await _work(conversation, task, ctx.agent.task_max_rounds)
    except AgwError as error:
        _fail(ctx, plan, task, error.reason, error.message)
        raise
    except RunStopped:  # the user ended the run: the task ends with it, canceled
        _drop(ctx, plan, task, "the user stopped the run")
        raise
    except asyncio.CancelledError:  # the run was cancelled, or failed in another task
        _drop(ctx, plan, task, "the run was stopped")
        raise
    if update is None:
        reason = f"the model did not report the task with {PLAN_UPDATE_TASK_TOOL}"
        _fail(ctx, plan, task, TASK_NOT_REPORTED, reason)
    elif update.status == "failed":
        _fail(ctx, plan, task, TASK_FAILED, update.result or "the task failed")
    else:
        task.status, task.result = "completed", update.result
        ctx.out.emit(events.task_complete(task.task_id, update.result))
        ctx.out.emit(events.plan_update(plan.plan_id, plan.to_pb()))


async def journaled_brief(ctx: RunContext, plan: Plan, task: Task) -> str:
    """The task's brief, as a step of the run: it shows the plan as it stood when the task
    began (other tasks may be further along when a resumed run gets here again)."""

    async def made() -> str:
        return brief(ctx, plan, task)

    return await ctx.out.step("brief", made, str, str)


def brief(ctx: RunContext, plan: Plan, task: Task) -> str:
    """The first message of the task's conversation."""
    details = ""
    if task.expected_output:
        details += f"Expected output: {task.expected_output}\n"
    if task.required_tools:
        details += f"Tools to use: {', '.join(task.required_tools)}\n"
    return (
        f"The user's request:\n{ctx.command.message}\n\n"
        f"The plan:\n{plan.outline()}\n\n"
        f"{TASK_ID_LINE}{task.task_id}\n"
        f"Your task: {task.description}\n{details}\n"
        f"When the task is done, call {PLAN_UPDATE_TASK_TOOL} with taskId "
        f'"{task.task_id}", status "completed" and its result (or "failed" and why).'
    )


def _drop(ctx: RunContext, plan: Plan, task: Task, why: str) -> None:
    """The run stops under the task: it ends canceled, and the plan says so."""
    task.status, task.result = "canceled", why
    ctx.out.emit(events.plan_update(plan.plan_id, plan.to_pb()))


def _fail(ctx: RunContext, plan: Plan, task: Task, reason: str, message: str) -> None:
    task.status, task.result = "failed", message
    ctx.out.emit(events.task_fail(task.task_id, reason, message))
    ctx.out.emit(events.plan_update(plan.plan_id, plan.to_pb()))


async def _work(conversation: Conversation, task: Task, max_rounds: int) -> TaskUpdate | None:
    """Rounds of the task until its report (None: no report, even when asked for it)."""
    asked = False  # the report was asked for (a repair, or the rounds used up)
    rounds = 0
    choice: dict[str, Any] | None = None
    while True:
        turn = await conversation.ask(tool_choice=choice)
        choice = None
        if any(c.name == PLAN_UPDATE_TASK_TOOL for c in turn.tool_calls):
            update = _report(conversation, turn.tool_calls, task)
            if update is not None:
                return update
            instruction = UPDATE_REPAIR
        elif turn.tool_calls and rounds < max_rounds:
            await conversation.round(turn, one_tool=True)
            rounds += 1
            if rounds < max_rounds:
                continue
            instruction = ROUNDS_USED
        elif turn.tool_calls:
            conversation.record([conversation.refuse(c, NO_MORE_ROUNDS) for c in turn.tool_calls])
            instruction = UPDATE_REPAIR
        else:
            instruction = UPDATE_REPAIR
        if asked:
            return None
        asked = True
        text = instruction.format(task_id=task.task_id, rounds=max_rounds)
        conversation.messages.append({"role": "user", "content": text})
        choice = {"type": "function", "function": {"name": PLAN_UPDATE_TASK_TOOL}}


def _report(conversation: Conversation, calls: list[ToolCall], task: Task) -> TaskUpdate | None:
    """Answer a turn that reports the task: its valid report, or None."""
    update: TaskUpdate | None = None
    outcomes: list[ToolOutcome] = []
    for call in calls:
        if call.name != PLAN_UPDATE_TASK_TOOL:
            reason = f"not executed: the task was reported with {PLAN_UPDATE_TASK_TOOL}"
            outcomes.append(conversation.refuse(call, reason))
        elif update is not None:
            outcomes.append(conversation.refuse(call, "the task was already reported"))
        else:
            try:
                update = parse_update(call.arguments, task.task_id)
            except PlanningArgumentsError as error:
                outcomes.append(conversation.refuse(call, f"invalid report: {error}"))
            else:
                outcomes.append(conversation.reply(call, "OK"))
    conversation.record(outcomes)
    return update
