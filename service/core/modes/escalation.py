"""Escalation: a REACT run that switches to PLAN_EXECUTE when the model asks for a plan.

A REACT agent with `react.escalate` is offered one more tool, `plan_create`,
which the mode handles itself (never executed, counted in no tool budget). The
REACT rounds go on as usual until the model calls it; then the call is
answered, any other call of that turn is refused, and the run goes on as
PLAN_EXECUTE — the agent's `planExecute` stages, on the same stream — with the
plan stage starting from the conversation so far: the chat's history, the
user's message, the REACT turns with their tool results, and the `plan_create`
call with its answer. A run whose model never calls it ends as a plain REACT run.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from service.core.modes.plan_execute import run_plan_execute
from service.core.run.context import Outcome, RunContext
from service.core.run.loop import Conversation, finish
from service.core.tools.definitions import ToolDefinition
from service.core.tools.names import PLAN_CREATE_TOOL

PLAN_CREATE = ToolDefinition(
    name=PLAN_CREATE_TOOL,
    kind="backend",
    description=(
        "Switch to plan mode: call this instead of answering when the request needs several "
        "steps that are best planned first. The steps are then planned and carried out one "
        "after another."
    ),
    parameters={
        "type": "object",
        "properties": {
            "reason": {"type": "string", "description": "Why the request needs a plan."}
        },
    },
)
SWITCHED = "OK: switching to plan mode"
NOT_NOW = "not executed: the run switched to plan mode"


async def run_escalating(ctx: RunContext) -> Outcome:
    """REACT with `plan_create` offered; PLAN_EXECUTE from the conversation once it is called."""
    stage = ctx.agent.stage("react")
    tools = ctx.stage_tools(stage).extended(planning=[PLAN_CREATE])
    conversation = Conversation.open(ctx, stage, tools=tools)
    turn = await conversation.converge(
        max_rounds=ctx.agent.react_max_steps,
        one_tool=True,
        stop_at=frozenset({PLAN_CREATE_TOOL}),
    )
    escalation = next((c for c in turn.tool_calls if c.name == PLAN_CREATE_TOOL), None)
    if escalation is None:
        return await finish(ctx, stage, turn.finish_reason)
    conversation.record(
        [
            conversation.reply(call, SWITCHED)
            if call is escalation
            else conversation.refuse(call, NOT_NOW)
            for call in turn.tool_calls
        ]
    )
    return await run_plan_execute(planning_from(ctx, conversation.messages))


def planning_from(ctx: RunContext, messages: list[dict[str, Any]]) -> RunContext:
    """`ctx` whose conversation so far is `messages` (after their system prompt): the plan
    stage opens with them as the chat's history and its last message."""
    planning = copy.copy(ctx)
    planning.query = dataclasses.replace(
        ctx.query, history=messages[1:-1], user_message=messages[-1]
    )
    return planning
