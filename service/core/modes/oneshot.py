"""ONESHOT: one answer from one model turn."""

from __future__ import annotations

from service.core.runner import Outcome, RunContext
from service.core.turn import stream_turn


async def run_oneshot(ctx: RunContext) -> Outcome:
    stage = ctx.agent.stage("plain")
    messages = [
        {"role": "system", "content": stage.system_prompt},
        {"role": ctx.request.role or "user", "content": ctx.request.message},
    ]
    client, request = ctx.model_call(stage, messages)
    turn = await stream_turn(ctx.run, ctx.ids, client, request)
    return Outcome(turn.finish_reason or "stop", turn.usage)
