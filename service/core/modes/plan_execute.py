"""PLAN_EXECUTE: plan the tasks, execute them one by one, then (optionally) summarise.

Plan stage, by `planExecute.plan.deepThinking`:
* `false`: one call, reasoning off, `tool_choice=required`, offering only
  `_plan_add_tasks_`;
* `true`: a draft first (reasoning on, `tool_choice=none`: a public planning
  text), then the same generating call.
A call without a valid plan gets one repair attempt; then the run fails
(`PLAN_FAILED`). The plan is announced with `plan.create`.

Execute stage, per task (its events carry its `taskId`): `task.start`, then
rounds of at most one tool call each until the model reports the task with
`_plan_update_task_` — one repair attempt (a forced call) if it answers without
reporting — then `task.complete` or `task.fail`, each followed by `plan.update`.
A failed task does not stop the plan; an error of the run (a budget, the
provider) fails the current task, then ends the run with `run.error`.

With `planExecute.plan.approval`, the plan waits for the user's approval
(`plan.approval`, answered through Submit); a rejected plan ends the run with
finish reason `plan_rejected`, its tasks canceled.

Summary stage (when configured): the answer, from the request and the tasks'
results, like ONESHOT (tools allowed, verify applies).
"""

from __future__ import annotations

import secrets
from typing import Any

from service.core import events
from service.core.agents import PLAN_ADD_TASKS_TOOL, PLAN_UPDATE_TASK_TOOL
from service.core.errors import TASK_FAILED, TASK_NOT_REPORTED, AgwError, PlanFailed
from service.core.runner import Outcome, RunContext
from service.core.tools.conversation import Conversation, finish
from service.core.tools.definitions import ToolDefinition
from service.core.tools.executor import ToolOutcome
from service.core.tools.permissions import allowed
from service.core.tools.planning import (
    EXECUTOR_TOOLS_HEADING,
    PLAN_ADD_TASKS,
    RESULTS_HEADING,
    TASK_ID_LINE,
    Plan,
    PlanningArgumentsError,
    Task,
    TaskUpdate,
    parse_tasks,
    parse_update,
)
from service.core.tools.registry import StageTools
from service.core.waits import WaitTimedOut

GENERATE_INSTRUCTION = f"Now record this plan by calling {PLAN_ADD_TASKS_TOOL}."
PLAN_REPAIR = f"You must record the plan now: call {PLAN_ADD_TASKS_TOOL} with at least one task."
UPDATE_REPAIR = (
    "You have not reported the task. Call " + PLAN_UPDATE_TASK_TOOL + " now with taskId "
    '"{task_id}", status "completed" and the result, or status "failed" and the reason.'
)


async def run_plan_execute(ctx: RunContext) -> Outcome:
    plan = await make_plan(ctx)
    if ctx.agent.plan_approval and not await approve(ctx, plan):
        for task in plan.tasks:
            task.status = "canceled"
        ctx.out.emit(events.plan_update(plan.plan_id, plan.to_pb()))
        return Outcome("plan_rejected", ctx.policies.usage)
    for task in plan.tasks:
        await execute_task(ctx, plan, task)
    agent = ctx.agent
    if not agent.has_stage("summary"):
        return await finish(ctx, agent.stage("execute"), "stop")
    stage = agent.stage("summary")
    brief = (
        f"The user's request:\n{ctx.command.message}\n\n"
        f"{RESULTS_HEADING}\n{plan.outline()}\n\n"
        "Write the answer for the user."
    )
    turn = await Conversation.open(ctx, stage, brief, history=False).converge()
    return await finish(ctx, stage, turn.finish_reason)


# Plan -------------------------------------------------------------------------------


async def make_plan(ctx: RunContext) -> Plan:
    """The plan stage: the tasks, announced with `plan.create`."""
    stage = ctx.agent.stage("plan")
    executing = ctx.tools.for_stage(ctx.agent.stage("execute"), ctx.agent.tool_policy)
    conversation = Conversation.open(ctx, stage, tools=StageTools.of((), [PLAN_ADD_TASKS]))
    conversation.messages[0]["content"] += capabilities(executing.ordinary)
    if ctx.agent.deep_thinking:
        draft = await conversation.ask(tool_choice="none", reasoning=True)
        if draft.tool_calls:
            refused = "not now: write the plan as text first"
            conversation.record([conversation.refuse(c, refused) for c in draft.tool_calls])
        conversation.messages.append({"role": "user", "content": GENERATE_INSTRUCTION})
    plan = Plan()
    for attempt in range(2):
        turn = await conversation.ask(tool_choice="required", reasoning=False)
        parsed: list[list[str] | str] = []  # per call: its tasks, or why it is refused
        for call in turn.tool_calls:
            if call.name != PLAN_ADD_TASKS_TOOL:
                parsed.append(f"only {PLAN_ADD_TASKS_TOOL} can be called while planning")
                continue
            try:
                parsed.append(parse_tasks(call.arguments))
            except PlanningArgumentsError as error:
                parsed.append(f"invalid plan: {error}")
        added = [plan.add(p) if isinstance(p, list) else p for p in parsed]
        if plan.tasks:
            ctx.out.emit(events.plan_create(plan.plan_id, plan.to_pb()))
        outcomes: list[ToolOutcome] = []
        for call, tasks in zip(turn.tool_calls, added, strict=True):
            if isinstance(tasks, str):
                outcomes.append(conversation.refuse(call, tasks))
            else:
                listed = [{"taskId": t.task_id, "description": t.description} for t in tasks]
                result = {"planId": plan.plan_id, "tasks": listed}
                outcomes.append(conversation.reply(call, result))
        conversation.record(outcomes)
        if plan.tasks:
            return plan
        if attempt == 0:
            conversation.messages.append({"role": "user", "content": PLAN_REPAIR})
    raise PlanFailed(f"the model did not record a plan with {PLAN_ADD_TASKS_TOOL}")


async def approve(ctx: RunContext, plan: Plan) -> bool:
    """The approval gate: `plan.approval`, then the user's answer through Submit.

    The payload `true`/`false`, `{"approved": bool}` or a word ("yes", "approve", "no")
    decides; no answer in time is a rejection.
    """
    approval_id = "appr_" + secrets.token_hex(4)
    bus = ctx.bus
    ctx.out.emit(
        events.make(
            "plan_approval",
            plan_id=plan.plan_id,
            approval_id=approval_id,
            plan=plan.to_pb(),
            timeout_ms=round(bus.wait_timeout_s * 1000),
        )
    )
    try:
        return allowed(await bus.wait(ctx.out, approval_id, "plan approval"))
    except WaitTimedOut:
        return False


def capabilities(tools: tuple[ToolDefinition, ...]) -> str:
    """The part of the plan stage's system prompt that lists the executors' tools."""
    if not tools:
        return ""
    lines = "\n".join(f"- {t.name}: {t.description}" for t in tools)
    return f"\n\n{EXECUTOR_TOOLS_HEADING}\n{lines}"


# Execute ----------------------------------------------------------------------------


async def execute_task(ctx: RunContext, plan: Plan, task: Task) -> None:
    """Run one task to its report; emits task.start … task.complete / task.fail.

    Every event of the task carries its `taskId`: the task works in its own scope.
    """
    ctx = ctx.for_task(task.task_id)
    out = ctx.out
    stage = ctx.agent.stage("execute")
    task.status = "in_progress"
    out.emit(events.task_start(task.task_id, task.description))
    out.emit(events.plan_update(plan.plan_id, plan.to_pb()))
    brief = (
        f"The user's request:\n{ctx.command.message}\n\n"
        f"The plan:\n{plan.outline()}\n\n"
        f"{TASK_ID_LINE}{task.task_id}\n"
        f"Your task: {task.description}\n\n"
        f"When the task is done, call {PLAN_UPDATE_TASK_TOOL} with taskId "
        f'"{task.task_id}", status "completed" and its result (or "failed" and why).'
    )
    try:
        update = await _work(Conversation.open(ctx, stage, brief, history=False), task)
    except AgwError as error:
        _fail(ctx, plan, task, error.reason, error.message)
        raise
    if update is None:
        reason = f"the model did not report the task with {PLAN_UPDATE_TASK_TOOL}"
        _fail(ctx, plan, task, TASK_NOT_REPORTED, reason)
    elif update.status == "failed":
        _fail(ctx, plan, task, TASK_FAILED, update.result or "the task failed")
    else:
        task.status, task.result = "completed", update.result
        out.emit(events.task_complete(task.task_id, update.result))
        out.emit(events.plan_update(plan.plan_id, plan.to_pb()))


def _fail(ctx: RunContext, plan: Plan, task: Task, reason: str, message: str) -> None:
    task.status, task.result = "failed", message
    ctx.out.emit(events.task_fail(task.task_id, reason, message))
    ctx.out.emit(events.plan_update(plan.plan_id, plan.to_pb()))


async def _work(conversation: Conversation, task: Task) -> TaskUpdate | None:
    """Rounds of the task until its report (None: no report, even after the repair)."""
    repaired = False
    choice: dict[str, Any] | None = None
    while True:
        turn = await conversation.ask(tool_choice=choice)
        choice = None
        if any(c.name == PLAN_UPDATE_TASK_TOOL for c in turn.tool_calls):
            update: TaskUpdate | None = None
            outcomes: list[ToolOutcome] = []
            for call in turn.tool_calls:
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
            if update is not None:
                return update
        elif turn.tool_calls:
            await conversation.round(turn, one_tool=True)
            continue
        if repaired:
            return None
        repaired = True
        repair = UPDATE_REPAIR.format(task_id=task.task_id)
        conversation.messages.append({"role": "user", "content": repair})
        choice = {"type": "function", "function": {"name": PLAN_UPDATE_TASK_TOOL}}
