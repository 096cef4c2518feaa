"""The model calls a policy adds to a run: the second pass and the reasoning summary.

* **verify: SECOND_PASS_FIX**: the final answer's first candidate stays internal;
  `second_pass` asks the model to check and correct it, and that answer streams.
* **output: REASONING_SUMMARY**: `summarize_reasoning` streams a short summary of
  the run's hidden reasoning as a reasoning block, written by one more model call
  (skipped when the model-call budget is used up).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from service.core import events
from service.core.agents.definition import ResolvedStage
from service.core.model import Reasoning
from service.core.run.context import RunContext
from service.core.run.observation import ModelCallObserver
from service.core.run.results import TurnResult
from service.core.run.turn import new_msg_id, stream_turn, turn_step

VERIFY_INSTRUCTION = (
    "Check the answer above against the conversation: correct any mistake, fill any gap, "
    "and keep what is right. Reply with the final answer only, as it should be shown to the "
    "user, without mentioning this check."
)
SUMMARY_INSTRUCTION = (
    "Summarise the reasoning below for the user in two or three sentences: what was "
    "considered and why the answer follows. Write plain prose, no preamble."
)


async def second_pass(
    ctx: RunContext, stage: ResolvedStage, messages: Sequence[dict[str, Any]]
) -> TurnResult:
    """SECOND_PASS_FIX: stream the checked version of the candidate answer ending `messages`."""
    check = [*messages, {"role": "user", "content": VERIFY_INSTRUCTION}]
    ctx.policies.budgets.use_model_call()
    client, request = ctx.model_call(stage, check)
    turn = await turn_step(
        ctx.run,
        ctx.out,
        request,
        lambda: stream_turn(
            ctx.run, ctx.out, ctx.ids, client, request, emit_reasoning=ctx.policies.stream_reasoning
        ),
    )
    ctx.policies.record(turn)
    return turn


async def summarize_reasoning(ctx: RunContext, stage: ResolvedStage) -> None:
    """REASONING_SUMMARY: stream a summary of the run's hidden reasoning as a reasoning block."""
    policies = ctx.policies
    text = "\n\n".join(policies.hidden_reasoning).strip()
    if not text or policies.budgets.model_calls_left <= 0:
        return
    policies.budgets.use_model_call()
    messages = [
        {"role": "system", "content": SUMMARY_INSTRUCTION},
        {"role": "user", "content": text},
    ]
    client, request = ctx.model_call(stage, messages, reasoning=Reasoning(enabled=False))
    run, out = ctx.run, ctx.out

    async def stream() -> TurnResult:
        result = TurnResult(
            msg_id=new_msg_id(), task_id=out.task_id, parent_tool_id=out.parent_tool_id
        )
        observer = ModelCallObserver(run, out, request)
        pieces: list[str] = []
        error: BaseException | None = None
        try:
            opened = client.stream(request)
            observer.opened()
            async with opened as deltas:
                async for delta in deltas:
                    if delta.restart is not None:  # starts over elsewhere: its block is void
                        if result.reasoning_id:
                            out.emit(events.reasoning_end(result.reasoning_id))
                        result.reasoning_id = ""
                        pieces.clear()
                        observer.restarted(delta.restart)
                        continue
                    piece = delta.content or delta.reasoning
                    if piece:
                        if not result.reasoning_id:
                            result.reasoning_id = ctx.ids.next_reasoning()
                            out.emit(events.reasoning_start(result.reasoning_id))
                        pieces.append(piece)
                        out.emit(events.reasoning_delta(result.reasoning_id, piece))
                    if delta.usage is not None:
                        result.usage = delta.usage
                    if delta.finish_reason:
                        result.finish_reason = delta.finish_reason
            if result.reasoning_id:
                out.emit(events.reasoning_end(result.reasoning_id))
        except BaseException as exc:
            error = exc
            raise
        finally:
            result.reasoning = "".join(pieces)
            observer.end(
                finish_reason=result.finish_reason,
                usage=result.usage,
                first_delta_ms=None,
                output=result.reasoning,
                error=error,
            )
            result.cost = observer.cost
            run.turn_finished(request, result)  # the summary is part of the chat's history
        return result

    result = await turn_step(run, out, request, stream)
    policies.add_usage(result.usage)
