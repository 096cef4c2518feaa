"""Traces, metrics, middlewares, debug levels and secrets, through the real service."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from agw.v1 import gateway_pb2 as gw
from google.protobuf import json_format
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from service.assembly.config import ModelPrice, ProviderSettings
from service.providers import loopback as lb
from service.providers.loopback import LoopbackProvider
from service.testing import Harness
from tests.core.tools.kit import agent, answer_turn, call_turn, kinds, tool_gateway, tools
from tests.observability import middlewares

SPANS = InMemorySpanExporter()
READER = InMemoryMetricReader()
FAKE_KEY = "sk-test-0123456789abcdef-FAKE"


@pytest.fixture(scope="module", autouse=True)
def sdk() -> Iterator[None]:
    """Install the SDK once for this process (OpenTelemetry allows one global provider)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(SPANS))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[READER]))
    yield


@pytest.fixture(autouse=True)
def clear_spans() -> None:
    SPANS.clear()


def metric_points(name: str) -> list:
    data = READER.get_metrics_data()
    points = []
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    points.extend(metric.data.data_points)
    return points


async def test_span_tree_of_a_run_with_a_tool_call(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = {"a": agent(toolConfig=tools("city_datetime"))}
    provider.enqueue(
        call_turn(("call_1", "city_datetime", '{"city":"Paris"}')), answer_turn("It is noon.")
    )
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        events = await gateway.query("a", "Time in Paris?")
        await gateway.app.frontdoor.flush()
    assert events[-1].type == "run.complete"
    spans = {span.name: span for span in SPANS.get_finished_spans()}
    rpc = spans["agw.v1.AgentGateway/Query"]
    run = spans["run a"]
    chats = [s for s in SPANS.get_finished_spans() if s.name == "chat fake-model"]
    tool = spans["execute_tool city_datetime"]
    assert rpc.kind == trace.SpanKind.SERVER
    assert run.parent.span_id == rpc.context.span_id
    assert len(chats) == 2 and all(c.parent.span_id == run.context.span_id for c in chats)
    assert tool.parent.span_id == run.context.span_id
    assert {s.context.trace_id for s in (rpc, run, tool, *chats)} == {rpc.context.trace_id}
    first = chats[0].attributes
    assert first["gen_ai.provider.name"] == "fake"
    assert first["gen_ai.request.model"] == "fake-model"
    assert first["gen_ai.usage.input_tokens"] == 10
    assert first["gen_ai.usage.output_tokens"] == 5
    assert first["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert first["agw.time_to_first_token_ms"] >= 0
    assert tool.attributes["gen_ai.tool.call.id"] == "call_1"
    assert run.attributes["agw.outcome"] == "completed"


async def test_traceparent_from_the_client_is_continued(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(answer_turn("hi"))
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    parent = "00f067aa0ba902b7"
    call = gateway.stub.Query(
        gw.QueryRequest(agent_key="plain", message="hi"),
        metadata=(("traceparent", f"00-{trace_id}-{parent}-01"),),
    )
    [event async for event in call]
    rpc = next(s for s in SPANS.get_finished_spans() if s.name.endswith("/Query"))
    assert format(rpc.context.trace_id, "032x") == trace_id
    assert format(rpc.parent.span_id, "016x") == parent


async def test_metrics_of_runs_models_and_tools(tmp_path: Path, provider: LoopbackProvider) -> None:
    agents = {"a": agent(toolConfig=tools("city_datetime"))}
    provider.enqueue(call_turn(("c1", "city_datetime", '{"city":"Oslo"}')), answer_turn("ok"))
    before = sum(p.value for p in metric_points("agw.runs.ended"))
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        await gateway.query("a", "Time in Oslo?")
    ended = metric_points("agw.runs.ended")
    assert sum(p.value for p in ended) == before + 1
    assert any(
        p.attributes == {"agw.agent": "a", "agw.mode": "ONESHOT", "agw.outcome": "completed"}
        for p in ended
    )
    tokens = {
        p.attributes["gen_ai.token.type"]: p
        for p in metric_points("gen_ai.client.token.usage")
        if p.attributes.get("gen_ai.provider.name") == "fake"
    }
    assert tokens["input"].sum >= 20 and tokens["output"].sum >= 10
    assert any(
        p.attributes["gen_ai.tool.name"] == "city_datetime"
        for p in metric_points("agw.tool.duration")
    )
    assert metric_points("gen_ai.client.operation.duration")
    assert metric_points("agw.model.time_to_first_token")
    assert metric_points("agw.run.time_to_first_delta")
    streams = metric_points("agw.streams.active")
    assert streams and all(p.value == 0 for p in streams)  # every stream closed again


async def test_a_middleware_that_rewrites_and_one_that_drops(
    agents_dir: Path, provider: LoopbackProvider
) -> None:
    paths = [
        "tests.observability.middlewares:redact",
        "tests.observability.middlewares:DropReasoning",
    ]
    middlewares.CALLS.clear()
    async with Harness.start(agents_dir, provider, middlewares=paths) as gateway:
        provider.enqueue(answer_turn("the secret", " is out", reasoning="private thoughts"))
        events = await gateway.query("thinker", "tell me")
    assert kinds(events) == [
        "request.query",
        "chat.start",
        "run.start",
        "content.start",
        "content.delta",
        "content.delta",
        "content.end",
        "run.complete",
    ]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[4].content_delta.delta == "the ******"
    assert [("start", events[0].run_id), ("end", "run.complete")] == middlewares.CALLS


async def test_a_middleware_cannot_drop_the_terminal_event(
    agents_dir: Path, provider: LoopbackProvider
) -> None:
    paths = ["tests.observability.middlewares:DropEverything"]
    async with Harness.start(agents_dir, provider, middlewares=paths) as gateway:
        provider.enqueue(answer_turn("x"))
        events = await gateway.query("plain", "hi")
    assert kinds(events) == ["run.complete"]
    assert events[0].seq == 1


async def test_a_bad_middleware_path_is_a_clear_error(agents_dir: Path) -> None:
    with pytest.raises(Exception, match="no_such_module"):
        async with Harness.start(agents_dir, None, middlewares=["no_such_module:x"]):
            pass


@pytest.mark.parametrize(
    ("level", "extra"),
    [
        (gw.DEBUG_LEVEL_OFF, []),
        (gw.DEBUG_LEVEL_BASIC, ["usage.update", "tool.timing", "usage.update"]),
        (
            gw.DEBUG_LEVEL_STANDARD,
            [
                "model.start",
                "model.end",
                "usage.update",
                "tool.timing",
                "model.start",
                "model.end",
                "usage.update",
            ],
        ),
    ],
)
async def test_debug_levels(
    tmp_path: Path, provider: LoopbackProvider, level: int, extra: list[str]
) -> None:
    agents = {"a": agent(toolConfig=tools("city_datetime"))}
    provider.enqueue(call_turn(("c1", "city_datetime", '{"city":"Rome"}')), answer_turn("ok"))
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        events = await gateway.query("a", "Time in Rome?", debug_level=level)
    debug = [
        e.type
        for e in events
        if e.type.split(".")[0] in ("model", "usage") or e.type == "tool.timing"
    ]
    assert debug == extra
    for event in events:
        if event.type == "model.end":
            assert event.model_end.usage.prompt_tokens == 10
        if event.type == "usage.update":
            assert event.usage_update.call_usage.completion_tokens == 5


async def test_full_debug_is_untruncated_and_standard_truncates(
    agents_dir: Path, provider: LoopbackProvider
) -> None:
    long = "word " * 1000
    async with Harness.start(agents_dir, provider) as gateway:
        for level in (gw.DEBUG_LEVEL_STANDARD, gw.DEBUG_LEVEL_FULL):
            provider.enqueue(answer_turn(long))
            events = await gateway.query("plain", long, debug_level=level)
            start = next(e.model_start for e in events if e.type == "model.start")
            end = next(e.model_end for e in events if e.type == "model.end")
            if level == gw.DEBUG_LEVEL_FULL:
                assert long in json.loads(start.input)[1]["content"] and end.output == long
            else:
                assert len(start.input) <= 2001 and len(end.output) <= 2001


async def test_usage_and_cost_from_the_price_table(
    agents_dir: Path, provider: LoopbackProvider
) -> None:
    prices = {"fake-model": ModelPrice(input_per_million=2.0, output_per_million=8.0)}
    async with Harness.start(agents_dir, provider, prices=prices, currency="EUR") as gateway:
        provider.enqueue(answer_turn("ok"))
        events = await gateway.query("plain", "hi")
    update = next(e.usage_update for e in events if e.type == "usage.update")
    assert update.call_cost == pytest.approx((10 * 2.0 + 5 * 8.0) / 1e6)
    assert update.run_cost == update.call_cost and update.currency == "EUR"
    assert update.run_usage.total_tokens == 15


async def test_secrets_never_reach_logs_or_debug_events(
    agents_dir: Path, provider: LoopbackProvider, caplog: pytest.LogCaptureFixture
) -> None:
    settings = {
        "providers": {
            "fake": ProviderSettings(
                base_url=provider.url, api_key=FAKE_KEY, default_model="fake-model", max_retries=0
            )
        },
        "default_provider": "fake",
    }
    with caplog.at_level(logging.DEBUG):
        async with Harness.start(agents_dir, None, **settings) as gateway:
            provider.enqueue(
                answer_turn("fine"),
                [lb.HttpError(401, {"error": {"message": "bad key " + FAKE_KEY}})],
            )
            events = await gateway.query("plain", "hi", debug_level=gw.DEBUG_LEVEL_FULL)
            failed = await gateway.query("plain", "again", debug_level=gw.DEBUG_LEVEL_FULL)
            with pytest.raises(grpc.aio.AioRpcError):
                await gateway.query("nope", FAKE_KEY)
    assert provider.request_headers[0]["authorization"] == f"Bearer {FAKE_KEY}"
    assert any(r.name == "agw.llm" for r in caplog.records)  # the interaction log ran
    for record in caplog.records:
        assert FAKE_KEY not in record.getMessage()
    for event in events + failed:
        assert FAKE_KEY not in json.dumps(json_format.MessageToDict(event))
    assert repr(gateway.app.settings).count(FAKE_KEY) == 0


async def test_log_lines_of_a_run_carry_its_trace_id(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    from service.assembly.telemetry import TraceIdFilter

    class Collect(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    handler = Collect()
    handler.addFilter(TraceIdFilter())
    logger = logging.getLogger("agw.run")
    logger.addHandler(handler)
    try:
        provider.enqueue([lb.HttpError(500, "boom")])
        await gateway.query("plain", "hi")
    finally:
        logger.removeHandler(handler)
    run_span = next(s for s in SPANS.get_finished_spans() if s.name == "run plain")
    assert handler.records
    assert handler.records[0].trace_id == format(run_span.context.trace_id, "032x")
