"""A server span per RPC, continuing the caller's W3C trace (`traceparent` metadata)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from opentelemetry import propagate, trace

from service.core.run.observation import NO_SPAN, tracer, tracing

SERVICE = "agw.v1.AgentGateway"


def rpc_span(method: str, context: Any) -> AbstractContextManager[trace.Span]:
    """Start the RPC's span as the current span, child of the caller's `traceparent`."""
    if not tracing():  # before reading the metadata: nothing to continue
        return NO_SPAN
    carrier = {
        key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)
    }
    return tracer.start_as_current_span(
        f"{SERVICE}/{method}",
        context=propagate.extract(carrier),
        kind=trace.SpanKind.SERVER,
        attributes={"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": method},
    )
