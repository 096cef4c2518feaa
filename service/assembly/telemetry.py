"""OpenTelemetry set-up: the SDK and exporters, installed once at start-up.

The core only uses the OpenTelemetry API (`service/core/run/observation.py`). With
both exporters set to "none" (the default) nothing is installed, the API stays
a no-op, and instrumentation costs next to nothing. "console" prints spans and
metrics to stdout; "otlp" sends them to an OTLP/gRPC collector
(`AGW_OTEL_ENDPOINT`, else the standard `OTEL_EXPORTER_OTLP_ENDPOINT`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from service.assembly.config import Settings

log = logging.getLogger("agw")


@dataclass
class Telemetry:
    """The installed providers, to flush and shut down at the end."""

    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    _closed: bool = field(default=False, repr=False)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        if self.meter_provider is not None:
            self.meter_provider.shutdown()


def _span_exporter(settings: Settings) -> SpanExporter:
    if settings.otel_traces_exporter == "console":
        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=settings.otel_endpoint or None)


def _metric_exporter(settings: Settings) -> MetricExporter:
    if settings.otel_metrics_exporter == "console":
        return ConsoleMetricExporter()
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter(endpoint=settings.otel_endpoint or None)


def configure(settings: Settings) -> Telemetry:
    """Install the SDK providers the settings ask for (none by default)."""
    telemetry = Telemetry()
    resource = Resource.create({"service.name": settings.otel_service_name})
    if settings.otel_traces_exporter != "none":
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(_span_exporter(settings)))
        trace.set_tracer_provider(provider)
        telemetry.tracer_provider = provider
        log.info("tracing to %s", settings.otel_traces_exporter)
    if settings.otel_metrics_exporter != "none":
        reader = PeriodicExportingMetricReader(
            _metric_exporter(settings),
            export_interval_millis=settings.otel_metrics_interval_s * 1000,
        )
        meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
        metrics.set_meter_provider(meter_provider)
        telemetry.meter_provider = meter_provider
        log.info("metrics to %s", settings.otel_metrics_exporter)
    return telemetry


class TraceIdFilter(logging.Filter):
    """Adds `trace_id` to every log record made inside a span (empty otherwise)."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        record.trace_id = format(context.trace_id, "032x") if context.is_valid else ""
        return True
