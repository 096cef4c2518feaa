"""A rolling restart under load, behind a real gRPC load balancer, loses nothing.

Three replicas of the service run as real processes (`python -m service`) on a
throwaway PostgreSQL (chats, run logs, the run journal) and Redis (the run bus), with
the built-in demo model paced so that a run lasts several seconds (a REACT agent
whose script calls a tool twice, then answers). HAProxy is in front, proxying gRPC
and checking each replica through the gRPC health service (`haproxy.py`). Fifty
queries stream through HAProxy only, with the official Python client; meanwhile the
replicas are restarted one after the other: SIGTERM, wait for it to exit, start it
again, wait until HAProxy sends it calls again.

Each replica, on SIGTERM, says NOT_SERVING at once (checked on its own port), HAProxy
marks it down through its health check, and after the drain delay it hands its runs
over: another replica resumes each at once (`run.resume`, reason `drain`), and each
client streaming from it re-attaches through HAProxy after the last seq it got. Every
query succeeds, every run ends with exactly one terminal event, `run.complete`, its
seqs run 1, 2, 3, … with no gap and no duplicate, its answer is the answer of a run
never interrupted, its chat's history is whole, and it was resumed exactly as often
as replicas handed it over.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import re
import signal
import socket
import statistics
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from agw.v1 import events_pb2 as pb
from agw_client import AsyncClient
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.testing import write_agent
from tests.rolling.haproxy import CHECK_LINES, HAProxy

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "durable-runs.md"
QUERIES = 50
REPLICAS = ("r0", "r1", "r2")
DEMO_DELAY_MS = "250"  # per streamed word or argument fragment: a run lasts ~10 s
DRAIN_DELAY_S = "1"  # HAProxy checks every 200 ms: it has stopped sending calls by then
START_TIMEOUT_S = 60.0
LEASE_TTL_S = 10.0  # AGW_REDIS_LEASE_TTL_S's default: a hand-over does not wait for it
TERMINALS = {"run.complete", "run.error", "run.cancel"}
SERVING = health_pb2.HealthCheckResponse.SERVING

ANSWER = (
    "Lyon stays mild on both days: the forecasts above come from demo data, one call per day, "
    "and this sentence is long enough to take a few seconds to stream word by word."
)
AGENT = {
    "mode": "REACT",
    "modelConfig": {
        "extraBody": {
            "demo": {
                "script": {
                    "calls": [
                        {"tool": "mock_city_weather", "arguments": {"city": "Lyon", "date": d}}
                        for d in ("2030-01-01", "2030-01-02")
                    ],
                    "answer": ANSWER,
                }
            }
        }
    },
    "toolConfig": {"backends": ["mock_city_weather"]},
    "react": {"systemPrompt": "Look the weather up, then answer.", "maxSteps": 5},
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Replica:
    """One replica: a `python -m service` process on a fixed port, started again as a new
    process (a new replica id) after each stop."""

    name: str
    port: int
    env: dict[str, str]
    directory: Path
    process: asyncio.subprocess.Process | None = None
    starts: int = 0

    async def start(self) -> None:
        replica_id = f"{self.name}.{self.starts}"
        self.starts += 1
        log = self.directory / f"{replica_id}.log"
        port_file = self.directory / f"{replica_id}.port"
        with log.open("wb") as out:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "service",
                "--port-file",
                str(port_file),
                cwd=self.directory,
                env={**self.env, "AGW_REPLICA_ID": replica_id},
                stdout=out,
                stderr=out,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (port_file.exists() and port_file.read_text()):
            if self.process.returncode is not None or time.monotonic() > deadline:
                raise AssertionError(f"{replica_id} did not start:\n{log.read_text()}")
            await asyncio.sleep(0.05)

    def logs(self) -> str:
        return "".join(path.read_text() for path in sorted(self.directory.glob("*.log")))


@pytest.fixture
async def replicas(
    tmp_path: Path, postgres_dsn: str, redis_url: str
) -> AsyncIterator[dict[str, Replica]]:
    agents = tmp_path / "agents"
    write_agent(agents, "rolling", AGENT)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "gen"))),
        "AGW_AGENTS_DIR": str(agents),
        "AGW_AGENTS_WATCH": "false",
        "AGW_HTTP_ENABLED": "false",
        "AGW_RUN_BUS": "redis",
        "AGW_REDIS_URL": redis_url,
        "AGW_CHAT_STORE": "postgres",
        "AGW_RUN_LOG": "postgres",
        "AGW_RUN_JOURNAL": "postgres",
        "AGW_POSTGRES_DSN": postgres_dsn,
        "AGW_DEMO_DELAY_MS": DEMO_DELAY_MS,
        "AGW_DRAIN_DELAY_S": DRAIN_DELAY_S,
        "AGW_SHUTDOWN_GRACE_S": "30",
        "AGW_REDIS_LEASE_TTL_S": str(LEASE_TTL_S),
        "AGW_LOG_LEVEL": "INFO",
        "AGW_LOG_FORMAT": "text",
    }
    members: dict[str, Replica] = {}
    for name in REPLICAS:
        directory = tmp_path / name
        directory.mkdir()
        env_of = {**env, "AGW_GRPC_ADDRESS": f"127.0.0.1:{free_port()}"}
        env_of["AGW_DATA_DIR"] = str(directory / "data")
        port = int(env_of["AGW_GRPC_ADDRESS"].rpartition(":")[2])
        members[name] = Replica(name, port, env_of, directory)
    try:
        await asyncio.gather(*(replica.start() for replica in members.values()))
        yield members
    finally:
        for replica in members.values():
            process = replica.process
            if process is not None and process.returncode is None:
                process.kill()
                await process.wait()


@pytest.fixture
async def haproxy(tmp_path: Path, replicas: dict[str, Replica]) -> AsyncIterator[HAProxy]:
    servers = {name: replica.port for name, replica in replicas.items()}
    proxy = await HAProxy.start(tmp_path, free_port(), servers)
    try:
        for name in replicas:
            await proxy.wait(name, "UP")
        yield proxy
    finally:
        await proxy.stop()


async def _stream(agw: AsyncClient, n: int) -> tuple[list[pb.Event], int]:
    """One query through HAProxy, followed to its end: its events and how often its
    stream re-attached."""
    stream = agw.query("rolling", f"What is the weather in Lyon? ({n})")
    events = [event async for event in stream if event.seq]  # heartbeats have seq 0
    return events, stream.reattached


async def _restart(replica: Replica, proxy: HAProxy) -> dict[str, Any]:
    """SIGTERM `replica`, see it say NOT_SERVING at once and HAProxy mark it down through the
    health check, wait for it to exit, start it again, wait until HAProxy sends it calls."""
    assert replica.process is not None
    async with grpc.aio.insecure_channel(f"127.0.0.1:{replica.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)  # asked on its own port, not through HAProxy
        asked = health_pb2.HealthCheckRequest()
        assert (await health.Check(asked, timeout=10)).status == SERVING
        replica.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        while (await health.Check(asked, timeout=10)).status == SERVING:
            assert time.monotonic() - signalled < 5, "still SERVING 5 s after SIGTERM"
            await asyncio.sleep(0.005)
        not_serving_after = time.monotonic() - signalled
    down = await proxy.wait(replica.name, "DOWN", timeout_s=10)
    down_after = time.monotonic() - signalled
    code = await asyncio.wait_for(replica.process.wait(), START_TIMEOUT_S)
    exited_after = time.monotonic() - signalled
    await replica.start()
    await proxy.wait(replica.name, "UP")
    return {
        "code": code,
        "not_serving_after": not_serving_after,
        "down": down,
        "down_after": down_after,
        "exited_after": exited_after,
    }


LOG_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO +agw\.runtime: "
    r"run ([0-9a-f]{16}) (handed over|resumed \(drain)",
    re.MULTILINE,
)


def _handover_waits(logs: str) -> dict[str, list[float]]:
    """Per run handed over, the seconds from each hand-over (on the draining replica) to its
    `run.resume` (reason drain) on another one, from the replicas' logs."""
    moments: dict[str, list[tuple[float, str]]] = {}
    for stamp, run_id, what in LOG_LINE.findall(logs):
        at = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        moments.setdefault(run_id, []).append((at, what))
    waits: dict[str, list[float]] = {}
    for run_id, seen in moments.items():
        seen.sort()
        kinds = [what for _, what in seen]
        assert kinds == ["handed over", "resumed (drain"] * (len(kinds) // 2), (run_id, kinds)
        waits[run_id] = [seen[i + 1][0] - seen[i][0] for i in range(0, len(seen), 2)]
    return waits


def _answer(events: list[pb.Event]) -> str:
    """The run's answer: its last content block's text."""
    blocks: dict[str, str] = {}
    for event in events:
        if event.type == "content.delta":
            block = event.content_delta.content_id
            blocks[block] = blocks.get(block, "") + event.content_delta.delta
    return list(blocks.values())[-1] if blocks else ""


def _shape(history: list[pb.Event]) -> list[Any]:
    """A chat's history without what differs from run to run: ids, times, seqs, usage."""
    shaped = []
    for event in history:
        if event.type == "run.resume":  # where a replica took it over: see the stream
            continue
        payload = json_format.MessageToDict(getattr(event, event.WhichOneof("payload") or ""))
        kept = {k: v for k, v in payload.items() if not k.endswith("Id") and k != "usage"}
        kept.pop("message", None)  # the query's words carry its number
        shaped.append((event.type, kept))
    return shaped


async def test_a_rolling_restart_behind_haproxy_loses_no_query_event_or_run(
    replicas: dict[str, Replica], haproxy: HAProxy
) -> None:
    began = time.monotonic()
    async with AsyncClient(f"127.0.0.1:{haproxy.port}") as agw:
        streams = [asyncio.create_task(_stream(agw, n)) for n in range(QUERIES)]
        await asyncio.sleep(1.0)  # they all stream
        restarts = {}
        for name, replica in replicas.items():  # one after the other
            restarts[name] = await _restart(replica, haproxy)
        reference = await _stream(agw, QUERIES)  # no replica stops during this one
        results = await asyncio.gather(*streams, return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        assert not failed, failed
        done: list[tuple[list[pb.Event], int]] = [r for r in results if isinstance(r, tuple)]
        histories = {
            events[0].chat_id: list((await agw.get_chat(events[0].chat_id)).events)
            for events, _ in [*done, reference]
        }
    took = time.monotonic() - began
    logs = "".join(replica.logs() for replica in replicas.values())
    handed = Counter(re.findall(r"run ([0-9a-f]{16}) handed over\n", logs))
    # every stream open on a stopping replica ended RUN_HANDED_OVER, none cut by its stop
    assert not re.findall(r"agw\.grpc: \w+ from .*: CANCELLED", logs)
    waits = _handover_waits(logs)
    assert sorted(waits) == sorted(handed), "each run handed over is resumed once per hand-over"
    slowest = max((max(w) for w in waits.values()), default=0.0)
    assert slowest < LEASE_TTL_S / 2, waits  # taken over at once, not once the lease expired
    print(  # shown with `pytest -s`: what one rolling restart took
        f"rolling restart: {took:.1f} s, {sum(handed.values())} hand-overs "
        f"(to resumed: median {statistics.median(w for ws in waits.values() for w in ws):.2f} s, "
        f"slowest {slowest:.2f} s), "
        + ", ".join(
            f"{name}: NOT_SERVING {r['not_serving_after'] * 1000:.0f} ms, "
            f"down {r['down_after']:.2f} s, exited {r['exited_after']:.2f} s"
            for name, r in restarts.items()
        )
    )

    for name, restart in restarts.items():
        assert restart["code"] == 0, (name, restart)
        assert restart["not_serving_after"] < 1.0, (name, restart)  # DRAIN_DELAY_S: 1
        assert restart["down"].last_check.endswith("comment: NOT_SERVING"), (name, restart)

    reference_events, reference_reattached = reference
    assert reference_reattached == 0
    expected = _answer(reference_events)
    assert ANSWER.split()[0] in expected
    assert not any(e.type == "run.resume" for e in reference_events)
    resumed_runs = 0
    for events, _reattached in done:
        run_id = events[0].run_id
        kinds = [e.type for e in events]
        assert [e.seq for e in events] == list(range(1, len(events) + 1)), (run_id, kinds)
        assert kinds[-1] == "run.complete", (run_id, kinds)
        assert sum(kind in TERMINALS for kind in kinds) == 1, (run_id, kinds)
        assert {e.run_id for e in events} == {run_id}
        assert _answer(events) == expected, run_id
        resumes = [e.run_resume for e in events if e.type == "run.resume"]
        assert [r.reason for r in resumes] == ["drain"] * handed[run_id], (run_id, kinds)
        assert [r.attempt for r in resumes] == list(range(1, len(resumes) + 1))
        resumed_runs += bool(resumes)
        assert _shape(histories[events[0].chat_id]) == _shape(
            histories[reference_events[0].chat_id]
        ), run_id
    assert resumed_runs >= QUERIES // 3, handed  # each replica handed its runs over
    assert sum(r for _, r in done) >= resumed_runs  # their clients followed them
    assert took < 120, took


def test_the_documented_load_balancer_checks_as_the_tested_one() -> None:
    """docs/durable-runs.md shows HAProxy's health check as this test configures it."""
    documented = [line.partition("#")[0].split() for line in DOCS.read_text().splitlines()]
    for line in CHECK_LINES:
        assert line.partition("#")[0].split() in documented, line
