"""ONESHOT: one answer; tool calls may happen on the way (run concurrently), then it converges."""

from __future__ import annotations

from service.core.run.context import Outcome, RunContext
from service.core.run.loop import Conversation, finish


async def run_oneshot(ctx: RunContext) -> Outcome:
    stage = ctx.agent.stage("plain")
    turn = await Conversation.open(ctx, stage).converge()
    return await finish(ctx, stage, turn.finish_reason)
