"""The server around the service: health, reflection, unimplemented RPCs, graceful stop."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

import grpc
import pytest
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from service.core.events import BLOCK_ENDS, BLOCKS
from service.testing import Harness
from tests.transport.test_query import error_info

ROOT = Path(__file__).resolve().parents[2]


async def test_health_reports_serving(gateway: Harness) -> None:
    health = health_pb2_grpc.HealthStub(gateway.channel)
    for service in ("", "agw.v1.AgentGateway"):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_reflection_lists_the_services(gateway: Harness) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(gateway.channel)

    async def requests():
        yield reflection_pb2.ServerReflectionRequest(list_services="")
        yield reflection_pb2.ServerReflectionRequest(file_containing_symbol="agw.v1.Event")

    replies = [reply async for reply in stub.ServerReflectionInfo(requests())]
    names = {s.name for s in replies[0].list_services_response.service}
    assert {"agw.v1.AgentGateway", "grpc.health.v1.Health"} <= names
    assert replies[1].file_descriptor_response.file_descriptor_proto


GARBAGE = b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"  # a length past the end


async def test_undecodable_health_and_reflection_calls_are_invalid_arguments(
    gateway: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """They were UNKNOWN, each with an ERROR and its traceback: anyone who can reach the
    port (health checks need no credentials) could fill the logs at will."""
    channel = gateway.channel
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(grpc.aio.AioRpcError) as check:
            await channel.unary_unary("/grpc.health.v1.Health/Check")(GARBAGE)
        watch = channel.unary_stream("/grpc.health.v1.Health/Watch")(GARBAGE)
        with pytest.raises(grpc.aio.AioRpcError) as watched:
            async for _ in watch:
                pass
        info = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
        )(iter([GARBAGE]))
        with pytest.raises(grpc.aio.AioRpcError) as reflected:
            async for _ in info:
                pass
    for error, name in [
        (check.value, "/grpc.health.v1.Health/Check"),
        (watched.value, "/grpc.health.v1.Health/Watch"),
        (reflected.value, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"),
    ]:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert error.details() == f"the request is not a valid {name} request"
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.name, r.levelname, r.exc_info) for r in records] == [
        ("agw.grpc", "WARNING", None)
    ] * 3
    # and they still answer what they should
    await test_health_reports_serving(gateway)
    await test_reflection_lists_the_services(gateway)


async def _start_service(tmp_path: Path, **env: str) -> tuple[asyncio.subprocess.Process, int]:
    agents = tmp_path / "agents"
    agents.mkdir(exist_ok=True)
    (agents / "slow.json").write_text(
        json.dumps({"mode": "ONESHOT", "plain": {"systemPrompt": "Be slow."}})
    )
    port_file = tmp_path / "port"
    port_file.unlink(missing_ok=True)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import asyncio, sys\n"
        "from service.__main__ import serve\n"
        "from service.assembly.config import Settings\n"
        "from service.assembly import logs\n"
        "logs.configure('INFO', 'text')\n"
        "asyncio.run(serve(Settings(), port_file=sys.argv[1]))\n",
        str(port_file),
        cwd=tmp_path,
        env={
            **os.environ,
            "AGW_GRPC_ADDRESS": "127.0.0.1:0",
            "AGW_HTTP_ADDRESS": "127.0.0.1:0",
            "AGW_AGENTS_DIR": str(agents),
            "AGW_AGENTS_WATCH": "false",
            "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "gen"))),
            **env,
        },
        stderr=asyncio.subprocess.PIPE,
    )
    for _ in range(200):
        if port_file.exists() and port_file.read_text():
            return process, int(port_file.read_text())
        await asyncio.sleep(0.05)
    process.kill()
    raise AssertionError("service did not start: " + (await process.stderr.read()).decode())


def assert_closed(events: list) -> None:
    """Every block of `events` is closed, and their seqs run 1, 2, 3, … without a gap."""
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    open_blocks: set[str] = set()
    for event in events:
        field = event.WhichOneof("payload")
        if field in BLOCKS:
            open_blocks.add(getattr(getattr(event, field), BLOCKS[field][1]))
        elif field in BLOCK_ENDS:
            open_blocks.remove(getattr(getattr(event, field), BLOCK_ENDS[field]))
    assert not open_blocks


async def _stream_until_sigterm(
    process: asyncio.subprocess.Process, port: int
) -> tuple[list, grpc.aio.AioRpcError | None]:
    events: list = []
    error = None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = gateway_pb2_grpc.AgentGatewayStub(channel)
        call = stub.Query(gw.QueryRequest(agent_key="slow", message="take your time"))
        try:
            async for event in call:
                events.append(event)
                if event.type == "content.delta" and len(events) == 12:
                    process.send_signal(signal.SIGTERM)
        except grpc.aio.AioRpcError as raised:
            error = raised
    assert await asyncio.wait_for(process.wait(), 15) == 0
    return events, error


@pytest.mark.parametrize(("grace", "delay_ms"), [("0.5", "100"), ("10", "5")])
async def test_sigterm_lets_a_run_finish_within_the_grace_else_hands_it_over(
    tmp_path: Path, grace: str, delay_ms: str
) -> None:
    """Within the grace period a run ends as usual; after it, the run is handed over: its
    stream ends with RUN_HANDED_OVER (no terminal event), and when the service is back,
    Attach from the last seq goes on — `run.resume`, the rest of the answer, `run.complete`
    — as one run: seqs without a gap or a repeat, every block closed."""
    process, port = await _start_service(
        tmp_path, AGW_SHUTDOWN_GRACE_S=grace, AGW_DEMO_DELAY_MS=delay_ms
    )
    try:
        events, error = await _stream_until_sigterm(process, port)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    if grace == "10":
        assert error is None and events[-1].type == "run.complete"
        assert_closed(events)
        return
    assert error is not None and error.code() == grpc.StatusCode.UNAVAILABLE, error
    info = error_info(error)
    assert info.reason == "RUN_HANDED_OVER"
    run_id = events[0].run_id
    assert info.metadata == {"run_id": run_id, "after_seq": str(events[-1].seq)}
    assert not any(e.type.startswith("run.") and e.type != "run.start" for e in events)
    assert any(e.type == "content.delta" for e in events)
    process, port = await _start_service(tmp_path, AGW_DEMO_DELAY_MS="5")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = gateway_pb2_grpc.AgentGatewayStub(channel)
            request = gw.AttachRequest(run_id=run_id, after_seq=events[-1].seq)
            rest = [event async for event in stub.Attach(request)]
            whole = [event async for event in stub.Attach(gw.AttachRequest(run_id=run_id))]
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 15) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    kinds = [e.type for e in rest]
    assert "run.resume" in kinds and kinds[-1] == "run.complete"
    resume = rest[kinds.index("run.resume")].run_resume
    assert (resume.reason, resume.attempt) == ("restart", 1)
    assert all(e.type.endswith(".end") for e in rest[: kinds.index("run.resume")])
    assert whole == [*events, *rest]
    assert_closed(whole)


async def test_sigterm_cancels_a_run_that_is_not_journaled(tmp_path: Path) -> None:
    """Without a journal (AGW_RUN_JOURNAL=none) a run cannot outlive its process: after the
    grace period it ends with `run.cancel` (shutdown), every block closed."""
    process, port = await _start_service(
        tmp_path, AGW_SHUTDOWN_GRACE_S="0.5", AGW_DEMO_DELAY_MS="100", AGW_RUN_JOURNAL="none"
    )
    try:
        events, error = await _stream_until_sigterm(process, port)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert error is None
    assert events[-1].type == "run.cancel" and events[-1].run_cancel.reason == "shutdown"
    assert [e.type for e in events].count("run.cancel") == 1
    assert_closed(events)


async def test_text_log_lines_read_plainly(tmp_path: Path) -> None:
    """The service's own text log: reloads name what changed, and no line ends in a blank
    (the trace id is only added inside a traced run)."""
    process, port = await _start_service(tmp_path)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = gateway_pb2_grpc.AgentGatewayStub(channel)
            agents = await stub.ListAgents(gw.ListAgentsRequest())
            assert [agent.key for agent in agents.agents] == ["slow"]
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 15) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.stderr is not None
    lines = (await process.stderr.read()).decode().splitlines()
    assert any(line.endswith("agents reloaded (version 1): added slow") for line in lines), lines
    assert any(" agw.grpc: ListAgents from ipv4:127.0.0.1:" in line for line in lines), lines
    assert [line for line in lines if line != line.rstrip()] == []


def test_a_traced_log_line_ends_with_its_trace_id() -> None:
    from service.assembly.logs import TextFormatter

    record = logging.makeLogRecord({"name": "agw.runtime", "msg": "run ended", "levelname": "INFO"})
    assert TextFormatter().format(record).endswith(" INFO    agw.runtime: run ended")
    record.trace_id = "0af7651916cd43dd8448eb211c80319c"
    assert (
        TextFormatter()
        .format(record)
        .endswith(" agw.runtime: run ended 0af7651916cd43dd8448eb211c80319c")
    )
