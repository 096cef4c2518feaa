"""The replanner of PLAN_EXECUTE: after a task (a wave), continue, revise or finish the plan.

Configured by `planExecute.replan` (its system prompt, optionally its model).
Its conversation lasts the run: each decision is asked with the plan as it
stands and the tasks that just ended, and answered with `_plan_decide_`:

* `continue`: the remaining tasks run as planned;
* `revise`: its tasks replace every task not started yet (those become
  canceled; the new ones are numbered on and may depend on earlier tasks);
* `finish`: the request is answered; the remaining tasks become canceled and
  the run goes on to the verifier or the summary.

Each decision is announced with `plan.revise` (the decision, its reason, the
plan after it), before the call's result. A replanner that gives no valid
decision, even when asked again, lets the plan continue.
"""

from __future__ import annotations

from typing import Any

from service.core.modes.plan_execute.fixed import decide
from service.core.modes.plan_execute.planner import revised
from service.core.run.context import RunContext
from service.core.run.loop import Conversation
from service.core.tools.names import PLAN_DECIDE_TOOL
from service.core.tools.planning import (
    PLAN_DECIDE,
    Decision,
    Plan,
    Task,
    parse_decision,
)
from service.core.tools.registry import StageTools

PLAN_HEADING = "The plan, with the results so far:"
ENDED_LINE = "Tasks that just ended: "
DECIDE_INSTRUCTION = (
    f"Decide how the plan goes on with {PLAN_DECIDE_TOOL}: continue with the remaining tasks, "
    "revise them (your tasks replace every task not started yet), or finish if the request "
    "is answered already."
)
DECIDE_REPAIR = f"You must decide now: call {PLAN_DECIDE_TOOL} with a decision and its reason."


class Replanner:
    """The replan stage of one run."""

    def __init__(self, ctx: RunContext, plan: Plan, executor_tools: frozenset[str]) -> None:
        self.ctx = ctx
        self.plan = plan
        self.executor_tools = executor_tools
        self.conversation: Conversation | None = None

    async def decide(self, ended: list[Task]) -> Decision | None:
        """Ask for the decision after the tasks `ended`, and apply it."""
        ctx = self.ctx
        brief = (
            f"{PLAN_HEADING}\n{self.plan.outline()}\n\n"
            f"{ENDED_LINE}{', '.join(t.task_id for t in ended)}\n\n{DECIDE_INSTRUCTION}"
        )
        if self.conversation is None:
            brief = f"The user's request:\n{ctx.command.message}\n\n{brief}"
            tools = StageTools.of((), [PLAN_DECIDE])
            stage = ctx.agent.stage("replan")
            self.conversation = Conversation.open(ctx, stage, brief, tools=tools, history=False)
        else:
            self.conversation.messages.append({"role": "user", "content": brief})
        return await decide(self.conversation, PLAN_DECIDE_TOOL, self._apply, DECIDE_REPAIR)

    def _apply(self, arguments: str) -> tuple[Decision, Any]:
        decision = parse_decision(arguments)
        plan = self.plan
        result: Any = "OK"
        if decision.kind == "revise":
            limit = self.ctx.agent.plan_max_tasks
            added = plan.revise(decision.tasks, limit=limit, tools=self.executor_tools)
            result = {"planId": plan.plan_id, "tasks": [t.listing() for t in added]}
        elif decision.kind == "finish":
            for task in plan.remaining:
                task.status = "canceled"
        self.ctx.out.emit(revised(plan, decision.kind, decision.reason))
        return decision, result
