"""The run policies of an agent: budgets, tool policy, output and verification.

* **Budgets** (`maxModelCalls`, `maxToolCalls`, `maxSteps`; `timeoutMs` is
  enforced by the runner): a run that would exceed one ends with `run.error`,
  reason `BUDGET_EXHAUSTED`, metadata `budget` (its name) and `limit`. A step is
  one round in which tools are executed; planning tools count toward no budget.
* **toolPolicy**: DISALLOW offers no ordinary tools; REQUIRE sends
  `tool_choice=required` on the run's first call that offers them; ALLOW leaves
  the choice to the model.
* **verify: SECOND_PASS_FIX**: the final answer's first candidate stays internal;
  a second call checks and corrects it, and that answer streams.
* **output: REASONING_SUMMARY**: the model's raw reasoning is not streamed; when
  the run has its answer, a short summary of that reasoning, written by one more
  model call, streams as a reasoning block (skipped when the model-call budget
  is used up).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from service.core import events
from service.core.agents import AgentDefinition, Budget, ResolvedStage
from service.core.errors import BudgetExhausted
from service.core.model import Reasoning, ToolChoice, Usage
from service.core.observe import ModelCallObserver, add_usage
from service.core.turn import TurnResult, new_msg_id, stream_turn

if TYPE_CHECKING:
    from service.core.runner import RunContext

VERIFY_INSTRUCTION = (
    "Check the answer above against the conversation: correct any mistake, fill any gap, "
    "and keep what is right. Reply with the final answer only, as it should be shown to the "
    "user, without mentioning this check."
)
SUMMARY_INSTRUCTION = (
    "Summarise the reasoning below for the user in two or three sentences: what was "
    "considered and why the answer follows. Write plain prose, no preamble."
)


class Budgets:
    """What a run has used of its budgets; each `use_*` raises BudgetExhausted when over."""

    def __init__(self, budget: Budget) -> None:
        self.limits = budget
        self.model_calls = 0
        self.tool_calls = 0
        self.steps = 0

    def use_model_call(self) -> None:
        self.model_calls = self._use("maxModelCalls", self.model_calls, 1, "model calls")

    def use_tool_calls(self, count: int) -> None:
        self.tool_calls = self._use("maxToolCalls", self.tool_calls, count, "tool calls")

    def use_step(self) -> None:
        self.steps = self._use("maxSteps", self.steps, 1, "steps")

    @property
    def model_calls_left(self) -> int:
        return self.limits.max_model_calls - self.model_calls

    def _use(self, name: str, used: int, count: int, what: str) -> int:
        limit = {
            "maxModelCalls": self.limits.max_model_calls,
            "maxToolCalls": self.limits.max_tool_calls,
            "maxSteps": self.limits.max_steps,
        }[name]
        if used + count > limit:
            raise BudgetExhausted(
                f"the run used up its {name} budget ({limit} {what})",
                budget=name,
                limit=str(limit),
                used=str(used),
            )
        return used + count


class RunPolicies:
    """The policies of one run and the state they keep."""

    def __init__(self, agent: AgentDefinition) -> None:
        self.budgets = Budgets(agent.budget)
        self.tool_policy = agent.tool_policy
        self.verify = agent.verify == "SECOND_PASS_FIX"
        self.summarize_reasoning = agent.output == "REASONING_SUMMARY"
        self.hidden_reasoning: list[str] = []
        self._usage: Usage | None = None
        self._required_sent = False

    @property
    def stream_reasoning(self) -> bool:
        return not self.summarize_reasoning

    def tool_choice(self, offers_ordinary_tools: bool) -> ToolChoice | None:
        """The tool_choice of a call (None: the provider's default, "auto")."""
        if self.tool_policy == "REQUIRE" and offers_ordinary_tools and not self._required_sent:
            self._required_sent = True
            return "required"
        return None

    def record(self, turn: TurnResult) -> None:
        """Account for a finished model turn (usage, hidden reasoning)."""
        if turn.hidden_reasoning:
            self.hidden_reasoning.append(turn.hidden_reasoning)
        self.add_usage(turn.usage)

    def add_usage(self, usage: Usage | None) -> None:
        if usage is not None:
            self._usage = add_usage(self._usage, usage)

    @property
    def usage(self) -> Usage | None:
        """Token usage of the run's model calls so far (None when no provider reported any)."""
        return self._usage


async def second_pass(
    ctx: RunContext, stage: ResolvedStage, messages: Sequence[dict[str, Any]]
) -> TurnResult:
    """SECOND_PASS_FIX: stream the checked version of the candidate answer ending `messages`."""
    check = [*messages, {"role": "user", "content": VERIFY_INSTRUCTION}]
    ctx.policies.budgets.use_model_call()
    client, request = ctx.model_call(stage, check)
    turn = await stream_turn(
        ctx.run, ctx.out, ctx.ids, client, request, emit_reasoning=ctx.policies.stream_reasoning
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
    result = TurnResult(msg_id=new_msg_id(), task_id=out.task_id, parent_tool_id=out.parent_tool_id)
    observer = ModelCallObserver(run, out, request)
    pieces: list[str] = []
    error: BaseException | None = None
    try:
        async with client.stream(request) as deltas:
            async for delta in deltas:
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
        run.turn_finished(request, result)  # the summary is part of the chat's history
    policies.add_usage(result.usage)
