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

from typing import TYPE_CHECKING

from service.core.agents.definition import AgentDefinition
from service.core.agents.schema import Budget
from service.core.errors import BudgetExhausted
from service.core.model import ToolChoice, Usage, add_usage
from service.core.run.results import TurnResult

if TYPE_CHECKING:
    pass


class Budgets:
    """What a run has used of its budgets; each `use_*` raises BudgetExhausted when over."""

    __slots__ = (
        "limits",
        "model_calls",
        "steps",
        "tool_calls",
    )

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

    __slots__ = (
        "_required_sent",
        "_usage",
        "budgets",
        "hidden_reasoning",
        "summarize_reasoning",
        "tool_policy",
        "verify",
    )

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


class NestedBudgets(Budgets):
    """A nested run's budgets: its model calls and tool calls count in its caller's too."""

    __slots__ = ("caller",)

    def __init__(self, budget: Budget, caller: Budgets) -> None:
        super().__init__(budget)
        self.caller = caller

    def use_model_call(self) -> None:
        super().use_model_call()
        self.caller.use_model_call()

    def use_tool_calls(self, count: int) -> None:
        super().use_tool_calls(count)
        self.caller.use_tool_calls(count)
