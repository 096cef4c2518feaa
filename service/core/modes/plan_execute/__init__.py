"""PLAN_EXECUTE: plan the tasks, execute them, optionally verify, then (optionally) summarise.

The stages, each in its own module:

* plan (`planner`): the tasks, announced with `plan.create`; with
  `planExecute.plan.approval` the plan first waits for the user's approval
  (`plan.approval`, answered through Submit) — a rejected plan ends the run
  with finish reason `plan_rejected`, its tasks canceled;
* execute (`schedule`, `tasks`): each task from `task.start` to `task.complete`
  or `task.fail`, one after another in plan order, or, with
  `planExecute.execute.parallel`, as a graph of their dependencies with that
  many at once; a failed task does not stop the plan, only the tasks that
  depend on it;
* replan (`replanner`, optional): after each task (each wave), continue, revise
  or finish the plan (`plan.revise`);
* verify (`verifier`, optional): the results judged against the request; when
  more work is needed, the planner plans again with the verifier's improvements
  (the new tasks join the plan: `plan.revise`), the new tasks run, and the
  verifier judges again — `planExecute.verify.maxRounds` planning rounds at most;
  improvements still open after the last round are handed to the summary;
* summary (optional): the answer, from the request and the tasks' results in
  plan order, like ONESHOT (tools allowed, verify applies).
"""

from __future__ import annotations

from service.core import events
from service.core.modes.plan_execute.planner import (
    GENERATE_INSTRUCTION,
    PLAN_REPAIR,
    Planner,
    approve,
)
from service.core.modes.plan_execute.replanner import Replanner
from service.core.modes.plan_execute.schedule import Schedule
from service.core.modes.plan_execute.tasks import UPDATE_REPAIR
from service.core.modes.plan_execute.verifier import Verifier
from service.core.run.context import Outcome, RunContext
from service.core.run.loop import Conversation, finish
from service.core.tools.planning import RESULTS_HEADING, Plan

__all__ = ["GENERATE_INSTRUCTION", "PLAN_REPAIR", "UPDATE_REPAIR", "run_plan_execute"]

OPEN_POINTS_HEADING = "Points a check of these results found still open:"


async def run_plan_execute(ctx: RunContext) -> Outcome:
    agent = ctx.agent
    planner = Planner(ctx)
    plan = await planner.first()
    if agent.plan_approval and not await approve(ctx, plan):
        for task in plan.tasks:
            task.status = "canceled"
        ctx.out.emit(events.plan_update(plan.plan_id, plan.to_pb()))
        return Outcome("plan_rejected", ctx.policies.usage)
    replanner = Replanner(ctx, plan, planner.executor_tools) if agent.has_stage("replan") else None
    verifier = Verifier(ctx, plan) if agent.has_stage("verify") else None
    open_points: tuple[str, ...] = ()
    for planning_round in range(1, agent.verify_max_rounds + 1):
        await Schedule(ctx, plan, replanner).run()
        verdict = await verifier.judge() if verifier is not None else None
        if verdict is None or verdict.passed:
            break
        if planning_round == agent.verify_max_rounds or not await planner.again(verdict):
            open_points = verdict.improvements
            break
        if agent.plan_approval and not await approve(ctx, plan):
            for task in plan.remaining:  # the user wants no more work: on to the summary
                task.status = "canceled"
            ctx.out.emit(events.plan_update(plan.plan_id, plan.to_pb()))
            break
    if not agent.has_stage("summary"):
        return await finish(ctx, agent.stage("execute"), "stop")
    return await summarise(ctx, plan, open_points)


async def summarise(ctx: RunContext, plan: Plan, open_points: tuple[str, ...]) -> Outcome:
    """The summary stage: the answer from the request and the results, in plan order."""
    stage = ctx.agent.stage("summary")
    still_open = ""
    if open_points:
        still_open = f"{OPEN_POINTS_HEADING}\n" + "\n".join(f"- {p}" for p in open_points) + "\n\n"
    brief = (
        f"The user's request:\n{ctx.command.message}\n\n"
        f"{RESULTS_HEADING}\n{plan.outline()}\n\n{still_open}"
        "Write the answer for the user."
    )
    turn = await Conversation.open(ctx, stage, brief, history=False).converge()
    return await finish(ctx, stage, turn.finish_reason)
