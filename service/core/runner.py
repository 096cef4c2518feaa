"""Executes one run: resolves each stage's model, runs the mode, ends the run.

A mode is a coroutine of a `RunContext`: the run's state, the emitter of the
scope it works in (the run, or one plan task: `ctx.for_task(task_id)`), the
agent, the query, and the ports it may use (models, tools, the run bus), and
the services a stage may offer: its subagents (service/core/subagents.py) and
the skills (service/core/skills.py). A subagent runs as a nested run: a
context of its own (`lineage` names the agents calling it) on the same run.

The runner owns the run's lifecycle. Whatever the mode does, the run ends with
exactly one terminal event: `run.complete` when the mode returns (or raises
`RunStopped`: the user ended the run, e.g. at a doom loop), `run.error`
for a failure (with the failure's stable reason), `run.cancel` when the run's
task is cancelled — and `CancelledError` is re-raised, never swallowed.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import trace

from service.core import events, instruments
from service.core.agents import SKILL_TOOL, AgentDefinition, ResolvedStage
from service.core.commands import QueryCommand
from service.core.errors import AgwError, BudgetExhausted, InvalidRequest
from service.core.eventlog import Emitter
from service.core.memory import Turn
from service.core.model import ModelClient, ModelRequest, Usage
from service.core.policies import RunPolicies
from service.core.ports import RunBus
from service.core.runstate import RunState
from service.core.tools.executor import ToolExecutor
from service.core.tools.registry import StageTools, ToolRegistry
from service.core.turn import Ids

if TYPE_CHECKING:
    from service.core.skills import SkillRegistry
    from service.core.subagents import Subagents

log = logging.getLogger("agw.run")


class ModelRouter(Protocol):
    """Finds the client of a provider key (the providers package implements it)."""

    @property
    def default_key(self) -> str: ...

    def get(self, key: str) -> ModelClient: ...

    def default_model(self, key: str) -> str: ...


class RunStopped(Exception):
    """The user ended the run early; it completes with `finish_reason`."""

    def __init__(self, finish_reason: str) -> None:
        super().__init__(finish_reason)
        self.finish_reason = finish_reason


@dataclass(slots=True)
class Outcome:
    """How a mode ended normally."""

    finish_reason: str
    usage: Usage | None = None


@dataclass(slots=True)
class RunContext:
    """Everything a mode needs to execute a run, seen from one scope of it."""

    run: RunState
    out: Emitter  # where this scope's events go (the run's, or one task's)
    agent: AgentDefinition
    command: QueryCommand
    models: ModelRouter
    bus: RunBus  # where tools wait for the user's answers
    ids: Ids
    history: list[dict[str, Any]] = field(default_factory=list)  # the chat's last runs
    user_message: dict[str, Any] = field(default_factory=dict)  # this run's user message
    tools: ToolRegistry = field(default_factory=ToolRegistry)  # the tools the stages may use
    subagents: Subagents | None = None  # runs the agents a stage offers as tools
    skills: SkillRegistry | None = None  # the skills agents with `skills` are offered
    lineage: tuple[str, ...] = ()  # the agents whose subagent this run is, outermost first
    # The chat's memory by turn: the very messages of `history`'s start, which the context
    # window may summarise or trim (service/core/context.py); and the service's default
    # context length, for models the agent and the known-models table say nothing of.
    memory: list[Turn] = field(default_factory=list)
    context_length: int = 32_768
    policies: RunPolicies = field(init=False)  # budgets, tool policy, output, verify
    executor: ToolExecutor = field(init=False)  # runs the tool calls

    def __post_init__(self) -> None:
        self.policies = RunPolicies(self.agent)
        self.executor = ToolExecutor(
            self.run,
            self.out,
            self.tools,
            self.bus,
            self.agent.permission,
            agent_key=self.agent.key,
        )
        self.executor.ask_on_loop = self.agent.loop_detect.ask

    def for_task(self, task_id: str) -> RunContext:
        """This context for plan task `task_id`: its events carry the task's id.

        Budgets, policies and the tool executor's memory stay the run's.
        """
        scoped = copy.copy(self)
        scoped.out = self.out.scope(task_id)
        scoped.executor = self.executor.scoped(scoped.out)
        return scoped

    def stage_tools(self, stage: ResolvedStage) -> StageTools:
        """The tools `stage` offers: its configured tools, then its subagents."""
        tools = self.tools.for_stage(stage, self.agent.tool_policy)
        if self.subagents is None or not stage.tools.agents:
            return tools
        if self.agent.tool_policy == "DISALLOW":
            return tools
        return tools.extended(self.subagents.offer(self, stage.tools.agents))

    def system_prompt(self, stage: ResolvedStage, tools: StageTools) -> str:
        """The system prompt of `stage` offering `tools`: hints, and the skills it may load."""
        text = tools.system_prompt(stage.system_prompt)
        if self.skills is not None and SKILL_TOOL in tools.by_name:
            text += self.skills.prompt_section(self.agent)
        return text

    def model_call(
        self, stage: ResolvedStage, messages: list[dict[str, Any]], **options: Any
    ) -> tuple[ModelClient, ModelRequest]:
        """The client and request for a call of `stage` with `messages`."""
        return resolve_model(self.models, stage, messages, self.run.run_id, **options)


Mode = Callable[[RunContext], Awaitable[Outcome]]

#: A stage's name in the chat records and logs, where it differs from the agent file's.
STAGE_LABELS = {"plain": "oneshot"}


def resolve_model(
    models: ModelRouter,
    stage: ResolvedStage,
    messages: list[dict[str, Any]],
    run_id: str = "",
    **options: Any,
) -> tuple[ModelClient, ModelRequest]:
    """Pick the provider and model of `stage`: the stage's, else the service's defaults."""
    cfg = stage.model
    provider = cfg.provider_key or models.default_key
    client = models.get(provider)
    model = cfg.model or models.default_model(provider)
    if not model:
        raise InvalidRequest(
            f"stage {stage.name!r} names no model and provider {provider!r} has no default_model",
            provider=provider,
        )
    request = ModelRequest(
        provider=provider,
        model=model,
        messages=messages,
        reasoning=cfg.reasoning,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_tokens=cfg.max_tokens,
        extra_body=cfg.body_for(provider),
        run_id=run_id,
        stage=STAGE_LABELS.get(stage.name, stage.name),
    )
    for key, value in options.items():
        setattr(request, key, value)
    return client, request


async def execute(ctx: RunContext, mode: Mode) -> None:
    """Run `mode` in the run's span and record the run's metrics."""
    run = ctx.run
    labels = {"agw.agent": ctx.agent.key, "agw.mode": ctx.agent.mode}
    instruments.runs_started.add(1, labels)
    attributes = {**labels, "agw.run_id": run.run_id, "agw.chat_id": run.chat_id}
    with instruments.span(f"run {ctx.agent.key}", attributes=attributes):
        try:
            await _execute(ctx, mode)
        finally:
            terminal = run.terminal
            field = terminal.WhichOneof("payload") if terminal is not None else "run_cancel"
            span = trace.get_current_span()
            span.set_attribute("agw.outcome", instruments.OUTCOMES.get(field or "", "cancelled"))
            if field == "run_error" and terminal is not None:
                span.set_status(trace.StatusCode.ERROR, terminal.run_error.error.message)
            instruments.runs_ended.add(
                1, {**labels, "agw.outcome": instruments.OUTCOMES.get(field or "", "cancelled")}
            )


async def _execute(ctx: RunContext, mode: Mode) -> None:
    """Run `mode` under the agent's time budget and end the run with one terminal event."""
    run = ctx.run
    timeout_ms = ctx.agent.budget.timeout_ms
    try:
        async with asyncio.timeout(timeout_ms / 1000) as deadline:
            try:
                outcome = await mode(ctx)
            except TimeoutError:
                if deadline.expired():
                    raise
                raise AgwError("operation timed out") from None
    except TimeoutError:
        error = BudgetExhausted(
            f"run exceeded its timeoutMs budget of {timeout_ms} ms", budget="timeoutMs"
        )
        run.log.finish(events.run_error(error.reason, error.message, error.metadata))
    except asyncio.CancelledError:
        run.log.finish(events.run_cancel(run.cancel_reason or "cancel"))
        raise
    except RunStopped as stopped:
        finish_reason = stopped.finish_reason
        run.log.finish(events.run_complete(finish_reason, events.usage(run.accounting.usage)))
    except AgwError as error:
        log.warning("run %s failed: %s", run.run_id, error.message)
        run.log.finish(events.run_error(error.reason, error.message, error.metadata))
    except Exception as error:  # a bug: report it on the stream, keep serving
        log.exception("run %s failed unexpectedly", run.run_id)
        run.log.finish(events.run_error("INTERNAL", f"internal error ({type(error).__name__})"))
    else:
        used = run.accounting.usage  # every call of the run
        total = used if used is not None else outcome.usage
        run.log.finish(events.run_complete(outcome.finish_reason, events.usage(total)))
