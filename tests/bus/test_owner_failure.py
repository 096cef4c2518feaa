"""A replica lost mid-run: its runs end `run.error` OWNER_LOST everywhere; back, it is fenced."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis.asyncio as aioredis
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc

from service.providers.loopback import LoopbackProvider
from service.testing import FAKE_MODEL, FAKE_PROVIDER, oneshot_agent, write_agent
from tests.bus.conftest import eventually, rest, started, until
from tests.bus.test_replicas import ANSWER, HEAD, gated
from tests.core.tools.kit import answer_turn, call_turn, kinds
from tests.transport.test_query import error_info

ROOT = Path(__file__).resolve().parents[2]
OPEN = [*HEAD, "content.start", "content.delta"]  # a run streaming its first answer
#: One run resumed once after its first delta, as its client sees it: the interrupted
#: turn's block closed, `run.resume`, then the turn asked again.
RESUMED = [
    *OPEN,
    "content.end",
    "run.resume",
    "content.start",
    "content.delta",
    "content.delta",
    "content.end",
    "run.complete",
]
LOST = ["content.end", "run.error"]  # how a follower sees it end when its replica is lost


async def stream_of(redis_url: str, run_id: str) -> list[pb.Event]:
    """The run's events as its Redis stream holds them."""
    async with aioredis.Redis.from_url(redis_url) as client:
        entries = await client.xrange(f"agw:run:{run_id}:events")
    assert [entry_id for entry_id, _ in entries] == [
        f"0-{n}".encode() for n in range(1, len(entries) + 1)
    ]
    return [pb.Event.FromString(fields[b"e"]) for _, fields in entries]


async def status_of(redis_url: str, run_id: str) -> str:
    async with aioredis.Redis.from_url(redis_url) as client:
        status = await client.hget(f"agw:run:{run_id}:meta", "status")
    return status.decode() if status else ""


def assert_owner_lost(event: pb.Event, replica: str) -> None:
    error = event.run_error.error
    assert (error.reason, error.message, dict(error.metadata)) == (
        "OWNER_LOST",
        f"replica {replica} executing the run was lost (its lease expired)",
        {"replica": replica},
    )


async def test_a_zombie_owner_is_fenced_out_and_writes_nothing_more(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    script, (first, _second) = gated("w0 ", "w1 ", "w2")
    provider.enqueue(script, answer_turn("fresh"))
    async with started(tmp_path, provider, redis_url, lease_ttl_s=0.5) as replicas:
        a, b, c = replicas["A"], replicas["B"], replicas["C"]
        call = a.query("plain", "go")
        on_a: list[Any] = []
        delta = await until(call, "content.delta", on_a)
        run_id, chat_id = delta.run_id, delta.chat_id
        following = b.stub.Attach(gw.AttachRequest(run_id=run_id))
        on_b: list[Any] = []
        await until(following, "content.delta", on_b)  # B reads w0 from Redis

        a.bus.suspend()  # A freezes for Redis: no renewal, no append
        first.set()
        await until(call, "content.delta", on_a)  # A goes on locally: w1
        on_b += await rest(following)  # its lease expires: the run ends
        a.bus.resume()  # A's next append (w1) or renewal meets the new fence
        on_a += await rest(call)
        run = a.front.get_run(run_id)
        await a.front.flush()
        await asyncio.sleep(0.3)  # what A might still write would be there by now
        stream = await stream_of(redis_url, run_id)
        on_c = await c.attach(run_id)
        kept = await replicas.run_log.load(run_id)
        again = await c.ask("plain", "again", chat_id=chat_id)  # the chat is free
        await c.front.flush()
        records = await replicas.chats.read(chat_id)
    assert kinds(on_b) == [*OPEN, *LOST]
    assert_owner_lost(on_b[-1], "A")
    assert [e.seq for e in on_b] == list(range(1, len(on_b) + 1))
    assert kinds(on_a) == [*OPEN, "content.delta", "content.end", "run.cancel"]
    assert on_a[-1].run_cancel.reason == "fenced"
    assert on_a[:5] == on_b[:5]
    assert run.fenced
    assert stream == on_b and on_c == on_b
    assert [(r["_type"], r["runId"]) for r in records] == [
        ("query", run_id),  # written before A was fenced; nothing after
        ("query", again[0].run_id),
        ("step", again[0].run_id),
    ]
    assert kept is None  # A keeps no log of a run it lost; the stream is its log
    assert kinds(again) == ["request.query", "run.start", *ANSWER]
    assert provider.requests[1]["messages"] == [  # the lost run wrote no step to remember
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "again"},
    ]


async def test_a_run_nobody_follows_is_ended_by_a_janitor(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    script, _gates = gated("w0 ", "w1")
    provider.enqueue(script)
    async with started(tmp_path, provider, redis_url, lease_ttl_s=0.5) as replicas:
        a = replicas["A"]
        call = a.query("plain", "go")
        on_a: list[Any] = []
        delta = await until(call, "content.delta", on_a)

        async def published() -> bool:
            return len(await stream_of(redis_url, delta.run_id)) == len(on_a)

        await eventually(published, 5)
        a.bus.suspend()
        started_at = time.monotonic()

        async def ended() -> bool:
            return await status_of(redis_url, delta.run_id) == "ended"

        await eventually(ended, 5)
        took = time.monotonic() - started_at
        stream = await stream_of(redis_url, delta.run_id)
        a.bus.resume()
        on_a += await rest(call)
    assert kinds(stream) == [*OPEN, *LOST]
    assert_owner_lost(stream[-1], "A")
    assert stream[:5] == on_a[:5]
    assert kinds(on_a) == [*OPEN, "content.end", "run.cancel"]
    assert on_a[-1].run_cancel.reason == "fenced"
    assert took < 0.5 + 1.25 * 0.5 + 1.0  # the lease, a janitor's period, and some slack


async def test_submit_and_cancel_for_runs_whose_owner_is_gone_end_them_as_lost(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    plain, _gates = gated("so far", "never")
    provider.enqueue(call_turn(("call_f", "pick", "{}")), plain)
    ttl = {"A": 0.5, "B": 30.0}  # B's janitor does not come round during the test
    async with started(tmp_path, provider, redis_url, ("A", "B"), lease_ttl_s=ttl) as replicas:
        a, b = replicas["A"], replicas["B"]
        waiting_call = a.query("ui", "Choose")
        waiting: list[Any] = []
        end = await until(waiting_call, "tool.end", waiting)
        streaming_call = a.query("plain", "go")
        streaming: list[Any] = []
        delta = await until(streaming_call, "content.delta", streaming)
        runs = (end.run_id, delta.run_id)

        async def published() -> bool:
            streams = [await stream_of(redis_url, run_id) for run_id in runs]
            return [len(s) for s in streams] == [len(waiting), len(streaming)]

        await eventually(published, 5)
        a.bus.suspend()

        async def leases_gone() -> bool:
            async with aioredis.Redis.from_url(redis_url) as client:
                return not await client.exists(*(f"agw:run:{r}:lease" for r in runs))

        await eventually(leases_gone, 5)
        submitted = await b.stub.Submit(
            gw.SubmitRequest(run_id=end.run_id, tool_id=end.tool_end.tool_id)
        )
        cancelled = await b.stub.Cancel(gw.CancelRequest(run_id=delta.run_id))
        on_b = [await b.attach(run_id) for run_id in runs]
        a.bus.resume()
        waiting += await rest(waiting_call)
        streaming += await rest(streaming_call)
    assert (submitted.accepted, submitted.outcome) == (False, gw.SUBMIT_OUTCOME_EXPIRED)
    assert submitted.detail == (
        f"tool {end.tool_end.tool_id!r} stopped waiting "
        "(the run ended: the replica executing it was lost)"
    )
    assert (cancelled.cancelled, cancelled.detail) == (True, "cancelling")
    call = ["tool.start", "tool.args", "tool.args", "tool.end"]
    assert kinds(on_b[0]) == [*HEAD, *call, "run.error"]
    assert kinds(on_b[1]) == [*OPEN, *LOST]
    for followed in on_b:
        assert_owner_lost(followed[-1], "A")
    assert on_b[0][:-1] == waiting[:-1] and on_b[1][:5] == streaming[:5]
    assert kinds(waiting) == [*HEAD, *call, "run.cancel"]
    assert kinds(streaming) == [*OPEN, "content.end", "run.cancel"]
    assert {waiting[-1].run_cancel.reason, streaming[-1].run_cancel.reason} == {"fenced"}


async def _start_replica(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str, replica_id: str, ttl: float
) -> tuple[asyncio.subprocess.Process, int]:
    """`python -m service` as a replica on the Redis run bus; its process and gRPC port."""
    agents = tmp_path / "agents"
    write_agent(agents, "plain", oneshot_agent("You are terse."))
    log_file = tmp_path / "replica.log"
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'gen'}",
        "AGW_GRPC_ADDRESS": "127.0.0.1:0",
        "AGW_HTTP_ENABLED": "false",
        "AGW_AGENTS_DIR": str(agents),
        "AGW_AGENTS_WATCH": "false",
        "AGW_DATA_DIR": str(tmp_path / "data"),
        "AGW_CHAT_STORE": "memory",
        "AGW_RUN_LOG": "memory",
        "AGW_RUN_BUS": "redis",
        "AGW_REDIS_URL": redis_url,
        "AGW_REPLICA_ID": replica_id,
        "AGW_REDIS_LEASE_TTL_S": str(ttl),
        "AGW_DEFAULT_PROVIDER": FAKE_PROVIDER,
        f"AGW_PROVIDERS__{FAKE_PROVIDER.upper()}__BASE_URL": provider.url,
        f"AGW_PROVIDERS__{FAKE_PROVIDER.upper()}__DEFAULT_MODEL": FAKE_MODEL,
        f"AGW_PROVIDERS__{FAKE_PROVIDER.upper()}__MAX_RETRIES": "0",
        "AGW_LOG_LEVEL": "INFO",
        "AGW_LOG_FORMAT": "text",
    }
    with log_file.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "service", cwd=tmp_path, env=env, stderr=log, stdout=log
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = re.search(r"gRPC listening on .* \(port (\d+)\)", log_file.read_text())
        if found:
            return process, int(found.group(1))
        if process.returncode is not None:
            break
        await asyncio.sleep(0.05)
    process.kill()
    await process.wait()
    raise AssertionError("the replica did not start:\n" + log_file.read_text())


async def test_a_replica_stopped_then_killed_mid_run(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    """Stopped (SIGSTOP), the replica's lease still holds: a Cancel through another replica is
    refused with OWNER_LOST (UNAVAILABLE: retry) and changes nothing. Killed (SIGKILL), its run
    ends `run.error` OWNER_LOST for the follower on the other replica, within the lease."""
    ttl = 2.0
    script, _gates = gated("before the kill", "never")
    provider.enqueue(script)
    process, port = await _start_replica(tmp_path / "doomed", provider, redis_url, "doomed", ttl)
    try:
        async with (
            started(
                tmp_path / "b", provider, redis_url, ("B",), lease_ttl_s=ttl, reply_timeout_s=0.3
            ) as replicas,
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
        ):
            b = replicas["B"]
            doomed = gateway_pb2_grpc.AgentGatewayStub(channel)
            call = doomed.Query(gw.QueryRequest(agent_key="plain", message="go"))
            on_doomed: list[Any] = []
            delta = await until(call, "content.delta", on_doomed)
            run_id = delta.run_id
            following = b.stub.Attach(gw.AttachRequest(run_id=run_id))
            on_b: list[Any] = []
            await until(following, "content.delta", on_b)

            process.send_signal(signal.SIGSTOP)
            with pytest.raises(grpc.aio.AioRpcError) as unanswered:
                await b.stub.Cancel(gw.CancelRequest(run_id=run_id))
            process.send_signal(signal.SIGCONT)
            assert await status_of(redis_url, run_id) == "running"

            process.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            on_b += await rest(following)
            took = time.monotonic() - killed_at
            call.cancel()
            submitted = await b.stub.Submit(gw.SubmitRequest(run_id=run_id, tool_id="t_00000000"))
            cancelled = await b.stub.Cancel(gw.CancelRequest(run_id=run_id))
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
    assert unanswered.value.code() == grpc.StatusCode.UNAVAILABLE
    info = error_info(unanswered.value)
    assert (info.reason, dict(info.metadata)) == ("OWNER_LOST", {"run_id": run_id})
    assert unanswered.value.details() == (
        f"replica doomed executing run {run_id} did not answer within 0.3 s; retry"
    )
    assert process.returncode == -signal.SIGKILL
    assert kinds(on_b) == [*OPEN, *LOST]
    assert on_b[:5] == on_doomed
    assert [e.seq for e in on_b] == list(range(1, 8))
    assert_owner_lost(on_b[-1], "doomed")
    assert took < ttl + 1.5  # the lease runs out, and a follower notices within a quarter
    assert (submitted.outcome, submitted.detail) == (
        gw.SUBMIT_OUTCOME_EXPIRED,
        "tool 't_00000000' stopped waiting (run ended)",
    )
    assert (cancelled.cancelled, cancelled.detail) == (False, "the run had already ended")
