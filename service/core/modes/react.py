"""REACT: think, call at most one tool, observe — up to `react.maxSteps` rounds.

Each round is one model call; when it calls tools, only the first runs (the
others get an error result asking to call them in a later round) and its result
is fed back. After the last allowed round the model is asked once more, with
`tool_choice=none`, for its final answer. An agent with `react.escalate` may
switch to PLAN_EXECUTE on the way (service/core/modes/escalation.py).
"""

from __future__ import annotations

from service.core.modes.escalation import run_escalating
from service.core.run.context import Outcome, RunContext
from service.core.run.loop import Conversation, finish


async def run_react(ctx: RunContext) -> Outcome:
    if ctx.agent.escalates:
        return await run_escalating(ctx)
    stage = ctx.agent.stage("react")
    conversation = Conversation.open(ctx, stage)
    turn = await conversation.converge(max_rounds=ctx.agent.react_max_steps, one_tool=True)
    return await finish(ctx, stage, turn.finish_reason)
