"""The gateway's OpenTelemetry variants under test, besides the default (no exporter).

`gateway+otel` installs the SDK through the gateway's own `configure` as it
does with an exporter configured — a `TracerProvider` with a
`BatchSpanProcessor`, a `MeterProvider` with a `PeriodicExportingMetricReader`
(every second, so that exporting is measured too) — except that both
exporters discard what they get: the SDK's whole cost, without I/O.

`gateway-no-otel` runs the gateway with its instrumentation short-circuited:
the tracer, the metric instruments and the RPC span bound in every loaded
`service` module are replaced by objects that do nothing, so not even the
OpenTelemetry API's no-op calls are made. It is what the default is compared
with to measure what instrumentation costs when no exporter is configured.
`gateway-no-otel-2` is the same in a second process: how much two processes
of one server differ is the floor under any difference this benchmark can tell.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from service.assembly import telemetry
from service.assembly.config import Settings
from service.core.run import observation
from service.transport import tracing

EXPORT_INTERVAL_S = 1.0
WITH_SDK = "gateway+otel"
WITHOUT_INSTRUMENTATION = "gateway-no-otel"
WITHOUT_INSTRUMENTATION_AGAIN = "gateway-no-otel-2"  # the same, in another process


class DiscardSpans(SpanExporter):
    """A span exporter that drops every batch and reports success; counts the spans."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


class DiscardMetrics(MetricExporter):
    """A metric exporter that drops every collection and reports success; counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.exports = 0

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        self.exports += 1
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def with_sdk(settings: Settings) -> Settings:
    """The settings with both exporters configured and metrics exported every second."""
    return settings.model_copy(
        update={
            "otel_traces_exporter": "otlp",
            "otel_metrics_exporter": "otlp",
            "otel_metrics_interval_s": EXPORT_INTERVAL_S,
        }
    )


@dataclass
class Sdk:
    """The installed SDK and its two exporters."""

    telemetry: telemetry.Telemetry
    spans: DiscardSpans
    metrics: DiscardMetrics

    def counters(self) -> dict[str, int]:
        return {
            "otel_spans_exported": self.spans.spans,
            "otel_metric_exports": self.metrics.exports,
        }

    def flush(self) -> None:
        """Export every ended span and collect the metrics now."""
        if self.telemetry.tracer_provider is not None:
            self.telemetry.tracer_provider.force_flush()
        if self.telemetry.meter_provider is not None:
            self.telemetry.meter_provider.force_flush()


def install_sdk(settings: Settings) -> Sdk:
    """Install the SDK as the gateway does for `settings`, with the discarding exporters."""
    spans, metrics = DiscardSpans(), DiscardMetrics()

    def span_exporter(settings: Settings) -> SpanExporter:
        return spans

    def metric_exporter(settings: Settings) -> MetricExporter:
        return metrics

    telemetry._span_exporter = span_exporter
    telemetry._metric_exporter = metric_exporter
    return Sdk(telemetry.configure(settings), spans, metrics)


class _NoSpans:
    """A tracer whose spans are the shared invalid span (also a context manager)."""

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return trace.INVALID_SPAN

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return trace.INVALID_SPAN


class _NoMetric:
    """A counter, up-down counter and histogram in one, recording nothing."""

    def add(self, *args: Any, **kwargs: Any) -> None:
        return None

    def record(self, *args: Any, **kwargs: Any) -> None:
        return None


def _no_rpc_span(method: str, context: Any) -> trace.Span:
    return trace.INVALID_SPAN


def remove_instrumentation() -> int:
    """Short-circuit the instrumentation in every loaded `service` module; how many names."""
    replacements: dict[int, object] = {
        id(observation.tracer): _NoSpans(),
        id(tracing.rpc_span): _no_rpc_span,
    }
    no_metric = _NoMetric()
    for value in vars(observation).values():
        if isinstance(value, metrics.Instrument):
            replacements[id(value)] = no_metric
    replaced = 0
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "service" or name.startswith("service.")):
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in replacements:
                setattr(module, attr, replacements[id(value)])
                replaced += 1
    return replaced
