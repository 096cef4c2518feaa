"""ONESHOT: one answer; tool calls may happen on the way (run concurrently), then it converges."""

from __future__ import annotations

from service.core.runner import Outcome, RunContext
from service.core.tools.conversation import Conversation, finish


async def run_oneshot(ctx: RunContext) -> Outcome:
    stage = ctx.agent.stage("plain")
    turn = await Conversation.open(ctx, stage).converge()
    return await finish(ctx, stage, turn.finish_reason)
