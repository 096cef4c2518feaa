"""The per-call and per-run log lines, through the real gRPC transport.

Every gateway RPC logs one INFO line on `agw.grpc` when it ends (method, peer,
status, duration; a stream also the number of events it sent), and every run
one on `agw.runtime` (run, chat, agent, mode, outcome, duration, model calls,
tokens). Neither carries a message, an answer or a credential.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import grpc
import pytest
from agw.v1 import gateway_pb2 as gw

from service.assembly.config import ApiKeySettings
from service.assembly.logs import JsonFormatter, TextFormatter
from service.providers.loopback import (
    DONE,
    Gate,
    HttpError,
    LoopbackProvider,
    content,
    finish,
    usage,
)
from service.testing import Harness

SECRET_MESSAGE = "my private plan for Tuesday"
ANSWER_TEXT = "the confidential answer"


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="agw")
    return caplog


def calls(logs: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The per-call lines."""
    return [r for r in logs.records if r.name == "agw.grpc" and hasattr(r, "method")]


def runs(logs: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The per-run lines."""
    return [r for r in logs.records if r.name == "agw.runtime" and hasattr(r, "outcome")]


async def until_logged(logs: pytest.LogCaptureFixture, count: int) -> None:
    """The server logs a call when its handler has ended, just after the client saw the end."""
    for _ in range(200):
        if len(calls(logs)) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(
        f"expected {count} call lines, got {[r.getMessage() for r in calls(logs)]}"
    )


def assert_peer(peer: str) -> None:
    assert peer.startswith("ipv4:127.0.0.1:") and peer.rsplit(":", 1)[1].isdigit()


async def test_a_unary_call_logs_one_line(gateway: Harness, logs: pytest.LogCaptureFixture) -> None:
    await gateway.stub.ListAgents(gw.ListAgentsRequest())
    await until_logged(logs, 1)
    (line,) = calls(logs)
    assert line.levelno == logging.INFO
    assert (line.method, line.status) == ("ListAgents", "OK")
    assert_peer(line.peer)
    assert isinstance(line.duration_ms, float) and 0 <= line.duration_ms < 10_000
    assert not hasattr(line, "events")
    assert line.getMessage() == f"ListAgents from {line.peer}: OK in {line.duration_ms:.1f} ms"


async def test_a_query_logs_its_call_with_the_events_sent_and_its_run(
    gateway: Harness, provider: LoopbackProvider, logs: pytest.LogCaptureFixture
) -> None:
    provider.enqueue([content(ANSWER_TEXT), finish("stop"), usage(12, 5), DONE])
    events = await gateway.query("plain", SECRET_MESSAGE)
    assert [e.type for e in events][-1] == "run.complete" and len(events) == 7
    await until_logged(logs, 1)
    (call,) = calls(logs)
    assert (call.method, call.status, call.events) == ("Query", "OK", 7)
    assert call.getMessage() == (
        f"Query from {call.peer}: OK in {call.duration_ms:.1f} ms, 7 events"
    )
    (run,) = runs(logs)
    names = "run_id chat_id agent mode outcome reason model_calls tokens_in tokens_out"
    fields = {k: getattr(run, k) for k in names.split()}
    assert fields == {
        "run_id": events[0].run_id,
        "chat_id": events[0].chat_id,
        "agent": "plain",
        "mode": "ONESHOT",
        "outcome": "complete",
        "reason": "stop",
        "model_calls": 1,
        "tokens_in": 12,
        "tokens_out": 5,
    }
    assert run.levelno == logging.INFO and 0 <= run.duration_ms < 10_000
    assert run.getMessage() == (
        f"run {events[0].run_id} ended: complete (stop); chat {events[0].chat_id}, "
        f"agent plain, ONESHOT, {run.duration_ms:.1f} ms, 1 model call, 12 tokens in, 5 out"
    )


async def test_a_refused_query_logs_its_status_and_no_run(
    gateway: Harness, logs: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await gateway.query("nope", SECRET_MESSAGE)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    await until_logged(logs, 1)
    (call,) = calls(logs)
    assert (call.method, call.status, call.events) == ("Query", "NOT_FOUND", 0)
    assert runs(logs) == []


async def test_a_failed_run_logs_its_error_reason(
    gateway: Harness, provider: LoopbackProvider, logs: pytest.LogCaptureFixture
) -> None:
    provider.enqueue([HttpError(500, {"error": {"message": "upstream exploded"}})])
    events = await gateway.query("plain", SECRET_MESSAGE)
    assert events[-1].type == "run.error"
    await until_logged(logs, 1)
    (call,) = calls(logs)
    assert (call.status, call.events) == ("OK", len(events))  # the stream itself ended well
    (run,) = runs(logs)
    assert (run.outcome, run.reason, run.model_calls, run.tokens_in) == (
        "error",
        "PROVIDER_ERROR",
        1,
        0,
    )
    assert "upstream exploded" not in run.getMessage()


async def test_a_cancelled_run_logs_the_cancel_reason(
    gateway: Harness, provider: LoopbackProvider, logs: pytest.LogCaptureFixture
) -> None:
    gate = asyncio.Event()
    provider.enqueue([content("so far"), Gate(gate), content("never"), finish("stop"), DONE])
    call = gateway.stub.Query(gw.QueryRequest(agent_key="plain", message=SECRET_MESSAGE))
    seen = []
    async for event in call:
        seen.append(event)
        if event.type == "content.delta":
            await gateway.stub.Cancel(gw.CancelRequest(run_id=event.run_id))
    assert seen[-1].type == "run.cancel"
    await until_logged(logs, 2)
    assert [(c.method, c.status) for c in calls(logs)] == [("Cancel", "OK"), ("Query", "OK")]
    assert calls(logs)[1].events == len(seen)
    (run,) = runs(logs)
    assert (run.outcome, run.reason) == ("cancel", "cancel")


async def test_a_client_that_goes_away_is_logged_as_cancelled(
    gateway: Harness, provider: LoopbackProvider, logs: pytest.LogCaptureFixture
) -> None:
    gate = asyncio.Event()
    provider.enqueue([content("so far"), Gate(gate), content("rest"), finish("stop"), DONE])
    call = gateway.stub.Query(gw.QueryRequest(agent_key="plain", message=SECRET_MESSAGE))
    async for event in call:
        if event.type == "content.delta":
            break
    call.cancel()
    await until_logged(logs, 1)
    (line,) = calls(logs)
    assert (line.method, line.status) == ("Query", "CANCELLED")
    assert line.events == 5  # request.query, chat.start, run.start, content.start, .delta
    gate.set()


async def test_an_unauthenticated_call_is_logged_without_its_credential(
    agents_dir: Path, provider: LoopbackProvider, logs: pytest.LogCaptureFixture
) -> None:
    keys = [ApiKeySettings(key="key-alice-1234567890", tenant="acme", subject="alice")]
    async with Harness.start(agents_dir, provider, auth_api_keys=keys) as gateway:
        wrong = (("authorization", "Bearer wrong-key-0987654321"),)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await gateway.stub.ListChats(gw.ListChatsRequest(), metadata=wrong)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        await until_logged(logs, 1)
    (line,) = calls(logs)
    assert (line.method, line.status) == ("ListChats", "UNAUTHENTICATED")
    assert "wrong-key" not in JsonFormatter().format(line)


async def test_json_log_lines_carry_the_fields_and_no_content(
    gateway: Harness, provider: LoopbackProvider, logs: pytest.LogCaptureFixture
) -> None:
    provider.enqueue([content(ANSWER_TEXT), finish("stop"), usage(3, 2), DONE])
    events = await gateway.query("plain", SECRET_MESSAGE)
    await until_logged(logs, 1)
    formatter = JsonFormatter()
    call = json.loads(formatter.format(calls(logs)[0]))
    run = json.loads(formatter.format(runs(logs)[0]))
    assert {k: call[k] for k in ("level", "logger", "method", "status", "events")} == {
        "level": "INFO",
        "logger": "agw.grpc",
        "method": "Query",
        "status": "OK",
        "events": len(events),
    }
    assert_peer(call["peer"])
    assert {k: run[k] for k in ("logger", "agent", "mode", "outcome", "tokens_in")} == {
        "logger": "agw.runtime",
        "agent": "plain",
        "mode": "ONESHOT",
        "outcome": "complete",
        "tokens_in": 3,
    }
    for line in (call, run):
        text = json.dumps(line)
        assert SECRET_MESSAGE not in text and ANSWER_TEXT not in text


async def test_a_forwarded_for_over_tcp_does_not_change_the_peer(
    gateway: Harness, logs: pytest.LogCaptureFixture
) -> None:
    """Only the HTTP adapter's calls over a unix socket name their client; over TCP the
    connection's peer is logged whatever the metadata claims."""
    forged = (("x-forwarded-for", "203.0.113.9"),)
    await gateway.stub.ListAgents(gw.ListAgentsRequest(), metadata=forged)
    await until_logged(logs, 1)
    (line,) = calls(logs)
    assert_peer(line.peer)


async def test_a_workers_lines_carry_its_name(
    gateway: Harness, logs: pytest.LogCaptureFixture
) -> None:
    await gateway.stub.ListAgents(gw.ListAgentsRequest())
    await until_logged(logs, 1)
    (line,) = calls(logs)
    assert json.loads(JsonFormatter("w1").format(line))["worker"] == "w1"
    assert "worker" not in json.loads(JsonFormatter().format(line))
    text = TextFormatter("w1").format(line)
    assert text.endswith(f" INFO    [w1] agw.grpc: {line.getMessage()}")
