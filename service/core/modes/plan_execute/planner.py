"""The plan stage of PLAN_EXECUTE: the planner's conversation, its rounds, the approval gate.

By `planExecute.plan.deepThinking`:
* `false`: one call, reasoning off, `tool_choice=required`, offering only
  `_plan_add_tasks_`;
* `true`: a draft first (reasoning on, `tool_choice=none`: a public planning
  text), then the same generating call.
A call without a valid plan gets one repair attempt. A plan larger than
`planExecute.plan.maxTasks`, a dependency that is not an earlier task, or a
required tool the executors do not have is refused to the planner with the reason.

The first round's plan is announced with `plan.create` (no plan: the run fails
with `PLAN_FAILED`). When a verifier asks for more work, the planner plans again
in the same conversation, with the results so far and the verifier's
improvements: its tasks are added to the same plan, announced with `plan.revise`
(decision REVISE, the improvements as its reason).
"""

from __future__ import annotations

from service.core import events
from service.core.errors import PlanFailed
from service.core.run.context import RunContext
from service.core.run.executor import ToolOutcome
from service.core.run.loop import Conversation
from service.core.run.permissions import allowed
from service.core.run.waits import WaitTimedOut
from service.core.tools.definitions import ToolDefinition
from service.core.tools.names import PLAN_ADD_TASKS_TOOL
from service.core.tools.planning import (
    EXECUTOR_TOOLS_HEADING,
    PLAN_ADD_TASKS,
    RESULTS_HEADING,
    Plan,
    PlanningArgumentsError,
    Task,
    Verdict,
    parse_tasks,
)
from service.core.tools.registry import StageTools

GENERATE_INSTRUCTION = f"Now record this plan by calling {PLAN_ADD_TASKS_TOOL}."
PLAN_REPAIR = f"You must record the plan now: call {PLAN_ADD_TASKS_TOOL} with at least one task."
IMPROVEMENTS_HEADING = "A check of these results found that more work is needed:"
PLAN_AGAIN = (
    f"Plan the further tasks this needs and record them with {PLAN_ADD_TASKS_TOOL}: they are "
    "added to the plan, after its tasks so far (which they may depend on by id)."
)


class Planner:
    """The plan stage of one run: its conversation and the plan it builds."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        executing = ctx.stage_tools(ctx.agent.stage("execute"))
        self.executor_tools = frozenset(t.name for t in executing.ordinary)
        self.conversation = Conversation.open(
            ctx, ctx.agent.stage("plan"), tools=StageTools.of((), [PLAN_ADD_TASKS])
        )
        self.conversation.messages[0]["content"] += capabilities(executing.ordinary)
        self.plan = Plan(ctx.out.token("p_"))

    async def first(self) -> Plan:
        """The plan, announced with `plan.create`; `PlanFailed` when the model records none."""
        if not await self._round():
            raise PlanFailed(f"the model did not record a plan with {PLAN_ADD_TASKS_TOOL}")
        return self.plan

    async def again(self, verdict: Verdict) -> list[Task]:
        """Plan further tasks for the verifier's improvements; the tasks added (maybe none)."""
        improvements = "\n".join(f"- {item}" for item in verdict.improvements)
        brief = (
            f"{RESULTS_HEADING}\n{self.plan.outline()}\n\n"
            f"{IMPROVEMENTS_HEADING}\n{improvements}\n\n{PLAN_AGAIN}"
        )
        self.conversation.messages.append({"role": "user", "content": brief})
        return await self._round(reason="; ".join(verdict.improvements))

    async def _round(self, *, reason: str | None = None) -> list[Task]:
        """One planning round: the tasks it added (announced), after one repair at most.

        `reason` None: the first round (`plan.create`); else `plan.revise` with it.
        """
        ctx, conversation, plan = self.ctx, self.conversation, self.plan
        if ctx.agent.deep_thinking:
            draft = await conversation.ask(tool_choice="none", reasoning=True)
            if draft.tool_calls:
                refused = "not now: write the plan as text first"
                conversation.record([conversation.refuse(c, refused) for c in draft.tool_calls])
            conversation.messages.append({"role": "user", "content": GENERATE_INSTRUCTION})
        added: list[Task] = []
        for attempt in range(2):
            turn = await conversation.ask(tool_choice="required", reasoning=False)
            parsed: list[list[Task] | str] = []  # per call: its tasks, or why it is refused
            for call in turn.tool_calls:
                if call.name != PLAN_ADD_TASKS_TOOL:
                    parsed.append(f"only {PLAN_ADD_TASKS_TOOL} can be called while planning")
                    continue
                try:
                    limit = ctx.agent.plan_max_tasks - len(added)
                    tasks = plan.add(
                        parse_tasks(call.arguments), limit=limit, tools=self.executor_tools
                    )
                except PlanningArgumentsError as error:
                    parsed.append(f"invalid plan: {error}")
                else:
                    added += tasks
                    parsed.append(tasks)
            if added:
                self._announce(reason)
            outcomes: list[ToolOutcome] = []
            for call, answer in zip(turn.tool_calls, parsed, strict=True):
                if isinstance(answer, str):
                    outcomes.append(conversation.refuse(call, answer))
                else:
                    result = {"planId": plan.plan_id, "tasks": [t.listing() for t in answer]}
                    outcomes.append(conversation.reply(call, result))
            conversation.record(outcomes)
            if added:
                return added
            if attempt == 0:
                conversation.messages.append({"role": "user", "content": PLAN_REPAIR})
        return added

    def _announce(self, reason: str | None) -> None:
        plan = self.plan
        if reason is None:
            self.ctx.out.emit(events.plan_create(plan.plan_id, plan.to_pb()))
        else:
            self.ctx.out.emit(revised(plan, "revise", reason))


def revised(plan: Plan, decision: str, reason: str) -> events.Event:
    """The `plan.revise` event of `decision` ("continue", "revise", "finish") on `plan`."""
    return events.make(
        "plan_revise",
        plan_id=plan.plan_id,
        decision=f"PLAN_DECISION_{decision.upper()}",
        reason=reason,
        plan=plan.to_pb(),
    )


async def approve(ctx: RunContext, plan: Plan) -> bool:
    """The approval gate: `plan.approval`, then the user's answer through Submit.

    The payload `true`/`false`, `{"approved": bool}` or a word ("yes", "approve", "no")
    decides; no answer in time is a rejection.
    """
    approval_id = ctx.out.token("appr_")
    waits = ctx.services.waits
    ctx.out.emit(
        events.make(
            "plan_approval",
            plan_id=plan.plan_id,
            approval_id=approval_id,
            plan=plan.to_pb(),
            timeout_ms=round(waits.timeout_s * 1000),
        )
    )
    try:
        return allowed(
            await waits.wait(ctx.out, approval_id, "plan approval", kind="plan_approval")
        )
    except WaitTimedOut:
        return False


def capabilities(tools: tuple[ToolDefinition, ...]) -> str:
    """The part of the plan stage's system prompt that lists the executors' tools."""
    if not tools:
        return ""
    lines = "\n".join(f"- {t.name}: {t.description}" for t in tools)
    return f"\n\n{EXECUTOR_TOOLS_HEADING}\n{lines}"
