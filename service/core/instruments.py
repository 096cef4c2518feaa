"""Traces and metrics of the core, through the OpenTelemetry API only.

Names follow the OpenTelemetry semantic conventions for GenAI where they exist
(`gen_ai.client.operation.duration`, `gen_ai.client.token.usage`, span
attributes `gen_ai.*`); the gateway's own use the `agw.` prefix. Until the SDK
is installed (service/telemetry.py) every call here is a no-op.

The metrics and their attributes are listed in the README ("Observability").
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from opentelemetry import metrics, trace

tracer = trace.get_tracer("agw")


def tracing() -> bool:
    """Whether a tracer provider is installed (without one, spans are not even created)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def span(name: str, **options: Any) -> AbstractContextManager[trace.Span]:
    """`tracer.start_as_current_span`, or a no-op when tracing is off (saves its cost)."""
    if tracing():
        return tracer.start_as_current_span(name, **options)
    return nullcontext(trace.INVALID_SPAN)


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
