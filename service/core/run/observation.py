"""What the core reports of its work besides its output: traces, metrics, debug events.

Traces and metrics go through the OpenTelemetry API only. Names follow the
OpenTelemetry semantic conventions for GenAI where they exist
(`gen_ai.client.operation.duration`, `gen_ai.client.token.usage`, span
attributes `gen_ai.*`); the gateway's own use the `agw.` prefix. Until the SDK
is installed (at start-up, from the settings) every call here is a no-op. The
metrics and their attributes are listed in the README ("Observability").

What a model call and a tool call report besides their output.

Each model call gets a client span (GenAI semantic conventions) and its
metrics. When the provider reported usage and the model has a price (or the
debug level is basic or higher), a `usage.update` event gives the tokens and
cost of the call and of the run so far. From debug level standard,
`model.start`/`model.end` events carry the call's input and output, truncated
below debug level full and always masked. Each tool call gets a span, its
metrics and — from debug level basic — a `tool.timing` event.
"""

from __future__ import annotations

import json
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace

from service.core import events
from service.core.commands import DebugLevel
from service.core.errors import AgwError
from service.core.masking import mask
from service.core.model import Attempt, ModelRequest, Restart, Usage, add_usage
from service.core.run.eventlog import Emitter
from service.core.run.state import Pricing, RunState

tracer = trace.get_tracer("agw")


def tracing() -> bool:
    """Whether a tracer provider is installed (without one, spans are not even created)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


#: The span of code run while tracing is off: one shared no-op context (it is reentrant),
#: so that a run waiting inside a span holds no context manager of its own.
NO_SPAN: AbstractContextManager[trace.Span] = nullcontext(trace.INVALID_SPAN)


def span(name: str, **options: Any) -> AbstractContextManager[trace.Span]:
    """`tracer.start_as_current_span`, or a no-op when tracing is off (saves its cost)."""
    if tracing():
        return tracer.start_as_current_span(name, **options)
    return NO_SPAN


meter = metrics.get_meter("agw")

runs_started = meter.create_counter("agw.runs.started", unit="{run}", description="Runs started")
runs_ended = meter.create_counter(
    "agw.runs.ended", unit="{run}", description="Runs ended, by outcome"
)
active_streams = meter.create_up_down_counter(
    "agw.streams.active", unit="{stream}", description="Event streams open to clients"
)
time_to_first_delta = meter.create_histogram(
    "agw.run.time_to_first_delta",
    unit="s",
    description="From the start of a run to its first model delta",
)
operation_duration = meter.create_histogram(
    "gen_ai.client.operation.duration", unit="s", description="Duration of a model call"
)
token_usage = meter.create_histogram(
    "gen_ai.client.token.usage", unit="{token}", description="Tokens used by a model call"
)
time_to_first_token = meter.create_histogram(
    "agw.model.time_to_first_token", unit="s", description="From a model request to its first delta"
)
tool_duration = meter.create_histogram(
    "agw.tool.duration", unit="s", description="Duration of a tool call"
)
tool_errors = meter.create_counter(
    "agw.tool.errors", unit="{call}", description="Tool calls that failed or timed out"
)
submit_wait = meter.create_histogram(
    "agw.submit.wait", unit="s", description="How long a run waited for a Submit"
)

OUTCOMES = {"run_complete": "completed", "run_error": "failed", "run_cancel": "cancelled"}

TRUNCATE = 2000  # characters of input/output in debug events below level full

__all__ = ["ModelCallObserver", "Price", "Pricing", "observe_tool"]


@dataclass(frozen=True, slots=True)
class Price:
    input_per_million: float
    output_per_million: float
    cached_input_per_million: float | None = None

    def cost(self, usage: Usage) -> float:
        cached = usage.cached_tokens
        cached_price = self.cached_input_per_million
        if cached_price is None:
            cached_price = self.input_per_million
        return (
            (usage.prompt_tokens - cached) * self.input_per_million
            + cached * cached_price
            + usage.completion_tokens * self.output_per_million
        ) / 1_000_000


def _clip(text: str, full: bool) -> str:
    return text if full or len(text) <= TRUNCATE else text[:TRUNCATE] + "…"


def _detail(error: BaseException) -> Any:
    """The `ErrorDetail` of an error (its reason, message and facts when it has them)."""
    if isinstance(error, AgwError):
        return events.error_detail(error.reason, error.message, error.metadata)
    return events.error_detail("INTERNAL", f"{type(error).__name__}: {error}")


#: The metrics' attributes of runs (by agent and mode) and of model calls (by provider and
#: model): one dict shared by their runs or calls (and never changed), rather than one
#: held by each for as long as it lasts.
_ATTRIBUTES: dict[tuple[str, str, str], dict[str, str]] = {}
_MAX_ATTRIBUTES = 1024


def _keep(key: tuple[str, str, str], attributes: dict[str, str]) -> dict[str, str]:
    if len(_ATTRIBUTES) >= _MAX_ATTRIBUTES:
        _ATTRIBUTES.clear()
    _ATTRIBUTES[key] = attributes
    return attributes


def run_labels(agent_key: str, mode: str) -> dict[str, str]:
    """The attributes of a run's metrics (shared: not to be changed)."""
    key = ("run", agent_key, mode)
    labels = _ATTRIBUTES.get(key)
    if labels is None:
        labels = _keep(key, {"agw.agent": agent_key, "agw.mode": mode})
    return labels


def _call_attributes(provider: str, model: str) -> dict[str, str]:
    key = ("call", provider, model)
    attributes = _ATTRIBUTES.get(key)
    if attributes is None:
        attributes = _keep(
            key,
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": provider,
                "gen_ai.request.model": model,
            },
        )
    return attributes


class ModelCallObserver:
    """Reports one model call; `opened` once its client was asked for the call, `end`
    once, also on failure.

    A client that makes several attempts for one call (a model alias) reports each of
    them (`CallReport`): from debug level standard, each attempt then has its own
    `model.start`/`model.end`, naming its deployment; from debug level basic, a move to
    the next deployment before the first delta is a `model.fallback`; a restart after it
    (`restarted`) always is. A plain call has one `model.start`, when it is opened.
    """

    __slots__ = (
        "attempt_now",
        "attempt_started",
        "attributes",
        "call_id",
        "call_number",
        "cost",
        "failed",
        "model",
        "out",
        "request",
        "run",
        "span",
        "started",
    )

    def __init__(self, run: RunState, out: Emitter, request: ModelRequest) -> None:
        self.run = run
        self.out = out
        self.request = request
        request.report = self
        self.attempt_now: Attempt | None = None
        self.failed: tuple[Attempt, Exception] | None = None  # the attempt a fallback left
        self.model = request.model  # the model that answers (priced by its name)
        accounting = run.accounting
        accounting.model_calls += 1
        self.call_number = accounting.model_calls
        self.call_id = f"{run.run_id}_m_{accounting.model_calls}"
        self.cost = 0.0  # of the call, once it ended with a priced usage
        self.started = time.monotonic()
        self.attempt_started = self.started
        self.attributes = _call_attributes(request.provider, request.model)
        self.span = (
            tracer.start_span(
                f"chat {request.model}",
                kind=trace.SpanKind.CLIENT,
                attributes={
                    **self.attributes,
                    "agw.stage": request.stage,
                    "agw.call_id": self.call_id,
                },
            )
            if tracing()
            else trace.INVALID_SPAN
        )

    def opened(self) -> None:
        """The client was asked for the call: its `model.start`, unless it reported an
        attempt (whose `model.start` is out already)."""
        if self.attempt_now is None:
            self._start(self.request.provider, self.request.model)

    def attempt(self, attempt: Attempt) -> None:
        """`CallReport`: an attempt begins (after a failed one, a fallback)."""
        if self.failed is not None and self.run.debug_level >= DebugLevel.BASIC:
            failed, error = self.failed
            self._fallback(failed, error, attempt, restarted=False)
        first = self.attempt_now is None
        self.failed = None
        self.attempt_now = attempt
        self.attempt_started = time.monotonic()
        self.model = attempt.model
        self._start(attempt.provider, attempt.model, attempt, with_input=first)

    def attempt_failed(self, attempt: Attempt, error: Exception) -> None:
        """`CallReport`: the attempt failed before the call's first delta."""
        self.failed = (attempt, error)
        if self.run.debug_level >= DebugLevel.STANDARD and not self.run.done:
            duration = time.monotonic() - self.attempt_started
            self.out.emit(
                events.make(
                    "model_end",
                    call_id=self.call_id,
                    finish_reason="error",
                    duration_ms=round(duration * 1000),
                    attempt=attempt.number,
                    error=_detail(error),
                )
            )

    def restarted(self, restart: Restart) -> None:
        """The call starts over on its next attempt, its output so far void (the blocks of
        the failed attempt are closed already)."""
        self.attempt_failed(restart.failed, restart.error)
        self.failed = None
        self._fallback(restart.failed, restart.error, restart.next, restarted=True)
        self.attempt(restart.next)

    def _fallback(self, failed: Attempt, error: Exception, to: Attempt, *, restarted: bool) -> None:
        if self.run.done:
            return
        self.out.emit(
            events.make(
                "model_fallback",
                call_id=self.call_id,
                deployment=failed.deployment,
                attempt=failed.number,
                next_deployment=to.deployment,
                error=_detail(error),
                restarted=restarted,
            )
        )

    def _start(
        self, provider: str, model: str, attempt: Attempt | None = None, *, with_input: bool = True
    ) -> None:
        run = self.run
        if run.debug_level < DebugLevel.STANDARD or run.done:
            return
        full = run.debug_level >= DebugLevel.FULL
        text = ""
        if with_input:
            text = json.dumps(mask(self.request.messages), ensure_ascii=False, default=str)
        self.out.emit(
            events.make(
                "model_start",
                call_id=self.call_id,
                provider=provider,
                model=model,
                stage=self.request.stage,
                input=_clip(text, full),
                deployment=attempt.deployment if attempt is not None else "",
                attempt=attempt.number if attempt is not None else 0,
            )
        )

    def end(
        self,
        *,
        finish_reason: str,
        usage: Usage | None,
        first_delta_ms: float | None,
        output: str,
        error: BaseException | None,
    ) -> None:
        self.request.report = None  # no cycle left between the request and the run
        run, span = self.run, self.span
        duration = time.monotonic() - self.started
        failed = {**self.attributes, "error.type": type(error).__name__} if error else None
        operation_duration.record(duration, failed or self.attributes)
        if first_delta_ms is not None:
            time_to_first_token.record(first_delta_ms / 1000, self.attributes)
            if self.call_number == 1:
                since_run_start = self.started - run.started_at + first_delta_ms / 1000
                time_to_first_delta.record(since_run_start, {"agw.agent": run.agent_key})
            span.set_attribute("agw.time_to_first_token_ms", round(first_delta_ms, 1))
        if finish_reason:
            span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
        if usage is not None:
            span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
            token_usage.record(
                usage.prompt_tokens, {**self.attributes, "gen_ai.token.type": "input"}
            )
            token_usage.record(
                usage.completion_tokens, {**self.attributes, "gen_ai.token.type": "output"}
            )
        if error is not None:
            span.set_status(trace.StatusCode.ERROR, str(error)[:200])
            span.set_attribute("error.type", type(error).__name__)
        span.end()
        if run.done:
            return
        if run.debug_level >= DebugLevel.STANDARD:
            full = run.debug_level >= DebugLevel.FULL
            reason = finish_reason or ("error" if error else "")
            attempt = self.attempt_now
            self.out.emit(
                events.make(
                    "model_end",
                    call_id=self.call_id,
                    finish_reason=reason,
                    first_token_ms=round(first_delta_ms or 0),
                    duration_ms=round(duration * 1000),
                    usage=events.usage(usage),
                    output=_clip(json.dumps(mask(output), ensure_ascii=False), full)
                    if not isinstance(output, str)
                    else _clip(output, full),
                    attempt=attempt.number if attempt is not None else 0,
                    error=_detail(error) if error is not None else None,
                )
            )
        if usage is not None:
            self._report_usage(usage)

    def _report_usage(self, usage: Usage) -> None:
        accounting = self.run.accounting
        accounting.usage = add_usage(accounting.usage, usage)
        cost = accounting.pricing(self.model, usage) if accounting.pricing else None
        if cost is not None:
            accounting.cost += cost
            self.cost = cost
            self.span.set_attribute("agw.cost", cost)
        elif self.run.debug_level < DebugLevel.BASIC:
            return  # usage.update comes with cost tracking or from debug level basic
        self.out.emit(
            events.make(
                "usage_update",
                call_id=self.call_id,
                model=self.model,
                call_usage=events.usage(usage),
                run_usage=events.usage(accounting.usage),
                call_cost=cost or 0.0,
                run_cost=accounting.cost,
                currency=accounting.currency,
            )
        )


def observe_tool(
    run: RunState,
    out: Emitter,
    tool_id: str,
    name: str,
    kind: str,
    duration_ms: float,
    error: bool,
) -> None:
    """Metrics and the `tool.timing` event of a finished tool call."""
    labels: dict[str, Any] = {"gen_ai.tool.name": name, "agw.tool.kind": kind}
    if error:
        labels["error.type"] = "tool_error"
        tool_errors.add(1, {"gen_ai.tool.name": name})
    tool_duration.record(duration_ms / 1000, labels)
    if run.debug_level >= DebugLevel.BASIC and not run.done:
        out.emit(
            events.make(
                "tool_timing", tool_id=tool_id, tool_name=name, duration_ms=round(duration_ms)
            )
        )
