"""Executes one run: resolves each stage's model, runs the mode, ends the run.

The runner owns the run's lifecycle. Whatever the mode does, the run ends with
exactly one terminal event: `run.complete` when the mode returns, `run.error`
for a failure (with the failure's stable reason), `run.cancel` when the run's
task is cancelled — and `CancelledError` is re-raised, never swallowed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw

from service.core import events
from service.core.agents import AgentDefinition, ResolvedStage
from service.core.errors import AgwError, BudgetExhausted, InvalidRequest
from service.core.model import ModelClient, ModelRequest, Usage
from service.core.run import Run
from service.core.turn import Ids

log = logging.getLogger("agw.run")


class ModelRouter(Protocol):
    """Finds the client of a provider key (the providers package implements it)."""

    @property
    def default_key(self) -> str: ...

    def get(self, key: str) -> ModelClient: ...

    def default_model(self, key: str) -> str: ...


@dataclass(slots=True)
class Outcome:
    """How a mode ended normally."""

    finish_reason: str
    usage: Usage | None = None


@dataclass(slots=True)
class RunContext:
    """Everything a mode needs to execute a run."""

    run: Run
    agent: AgentDefinition
    request: gw.QueryRequest
    models: ModelRouter
    ids: Ids

    def model_call(
        self, stage: ResolvedStage, messages: list[dict[str, Any]], **options: Any
    ) -> tuple[ModelClient, ModelRequest]:
        """The client and request for a call of `stage` with `messages`."""
        return resolve_model(self.models, stage, messages, self.run.run_id, **options)


Mode = Callable[[RunContext], Awaitable[Outcome]]


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
        run_id=run_id,
        stage=stage.name,
    )
    for key, value in options.items():
        setattr(request, key, value)
    return client, request


def usage_message(usage: Usage | None) -> pb.Usage | None:
    if usage is None:
        return None
    return pb.Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        reasoning_tokens=usage.reasoning_tokens,
        cached_tokens=usage.cached_tokens,
    )


async def execute(ctx: RunContext, mode: Mode) -> None:
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
        run.finish(events.run_error(error.reason, error.message, error.metadata))
    except asyncio.CancelledError:
        run.finish(events.run_cancel(run.cancel_reason or "cancel"))
        raise
    except AgwError as error:
        log.warning("run %s failed: %s", run.run_id, error.message)
        run.finish(events.run_error(error.reason, error.message, error.metadata))
    except Exception as error:  # a bug: report it on the stream, keep serving
        log.exception("run %s failed unexpectedly", run.run_id)
        run.finish(events.run_error("INTERNAL", f"internal error ({type(error).__name__})"))
    else:
        run.finish(events.run_complete(outcome.finish_reason, usage_message(outcome.usage)))
