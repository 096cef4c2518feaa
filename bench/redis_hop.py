"""`python -m bench.redis_hop`: what the Redis run bus adds to a delta's way to a follower.

A run registered on one `RedisRunBus` (the owner) emits content deltas at a
steady pace (sustained, not saturated). Two followers read it: one on the
owner, from the run's event log (as a client attached to the replica executing
the run does), and one through a second `RedisRunBus` (another replica: the
events pushed on the run's channel). Each delta's arrival is timed at both; the
*added* latency of a delta is the remote arrival minus the local one. Its p50 is
compared with a bare Redis round trip (PING) measured in the same run at the
same pace (target: at most 1.5× it). Also reported: the CPU per event of the two
buses and of `redis-server` (its `used_cpu`), and the appends' script calls per
event (`INFO commandstats`: one call per loop tick carries every run's events).
Both buses live in this process, on one event loop, so the clocks agree; the
Redis server is a throwaway `redis-server` on loopback unless `--redis-url` names
one (its keys go under a prefix of their own; its CPU is then not ours alone).

    python -m bench.redis_hop [--streams 20] [--deltas 250] [--interval-ms 20]
                              [--redis-url URL] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncGenerator, Iterator
from typing import Any

from service.core import events
from service.core.events import Event
from service.core.ports import RunBus
from service.core.run.eventlog import EventLog
from service.core.run.state import RunState
from service.state.local.bus import LocalRunBus
from service.state.redis.bus import RedisRunBus

NO_DISK = ("--appendonly", "no", "--dir")
TARGET_RATIO = 1.5  # the added latency p50 over a PING round trip's


@contextlib.contextmanager
def throwaway_redis() -> Iterator[str]:
    """A redis-server on a free loopback port, persisting nothing; its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed: run `make install`")
    with tempfile.TemporaryDirectory() as directory, socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        process = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", *NO_DISK, directory],
            stdout=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                    break
                time.sleep(0.02)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.terminate()
            process.wait(10)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _redis_counters(bus: RedisRunBus) -> tuple[float, int, float]:
    """The CPU seconds the Redis server has used so far (user + system), and its EVALSHA
    calls and their µs so far."""
    cpu = await bus.redis.info("cpu")
    stats = (await bus.redis.info("commandstats")).get("cmdstat_evalsha", {})
    return (
        float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
        int(stats.get("calls", 0)),
        float(stats.get("usec", 0)),
    )


async def _play(
    owner: RunBus, other: RedisRunBus | None, streams: int, deltas: int, interval_s: float
) -> tuple[list[float], float, tuple[float, int, float]]:
    """Run `streams` runs of `deltas` paced deltas on `owner`, each followed on it and (with
    `other`) through `other`; the added µs of each delta, the CPU seconds this process
    used, and what `_redis_counters` grew by."""
    runs = [RunState(EventLog(secrets.token_hex(8), f"chat-{n}"), "bench") for n in range(streams)]
    for run in runs:
        assert await owner.register(run) is None
    local: dict[tuple[str, int], float] = {}
    remote: dict[tuple[str, int], float] = {}
    seen: dict[str, list[list[Event]]] = {run.run_id: [[], []] for run in runs}

    async def read(
        stream: AsyncGenerator[Event, None], times: dict[Any, float], into: list[Event]
    ) -> None:
        async for event in stream:
            times[event.run_id, event.seq] = time.perf_counter()
            into.append(event)

    readers = []
    for run in runs:
        readers.append(asyncio.create_task(read(run.follow(0), local, seen[run.run_id][0])))
        if other is not None:
            followed = await other.follow(run.run_id, 0)
            assert followed is not None and other.local(run.run_id) is None
            readers.append(asyncio.create_task(read(followed, remote, seen[run.run_id][1])))

    async def emit(run: RunState, start_s: float) -> None:
        """The run's deltas, on its own clock (the streams' paces are spread evenly)."""
        await asyncio.sleep(start_s)
        started = time.perf_counter()
        run.log.emit(events.run_start("bench"))
        run.log.emit(events.content_start("c1"))
        for n in range(deltas):
            run.log.emit(events.content_delta("c1", f"token {n} "))
            await asyncio.sleep(max(0.0, started + (n + 1) * interval_s - time.perf_counter()))
        run.log.finish(events.run_complete("stop"))

    counters = await _redis_counters(other) if other is not None else (0.0, 0, 0.0)
    cpu = time.process_time()
    await asyncio.gather(*(emit(run, n * interval_s / streams) for n, run in enumerate(runs)))
    await asyncio.wait_for(asyncio.gather(*readers), 60)
    cpu = time.process_time() - cpu
    if other is not None:
        after = await _redis_counters(other)
        counters = (after[0] - counters[0], after[1] - counters[1], after[2] - counters[2])
    for run in runs:
        await owner.ended(run)
        await owner.settled(run)
        await owner.release(run.run_id)
        if other is not None and seen[run.run_id][1] != seen[run.run_id][0]:
            raise AssertionError("the remote follower did not get exactly the local one's events")
    added = [(remote[key] - local[key]) * 1e6 for key in remote if key[1] > 2]
    return added, cpu, counters


async def _round_trip_us(bus: RedisRunBus, count: int, interval_s: float) -> float:
    """The p50 of a Redis round trip (PING) made at the same pace: the hop's floor here."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        await bus.redis.ping()
        times.append((time.perf_counter() - started) * 1e6)
        await asyncio.sleep(interval_s)
    return statistics.median(times)


async def measure(
    url: str, deltas: int = 250, interval_s: float = 0.02, streams: int = 20
) -> dict[str, Any]:
    """The figures, in µs: added latency per delta, and added CPU per delta."""
    prefix = f"agw-bench-{secrets.token_hex(4)}:"
    owner = RedisRunBus(url, replica_id="bench-owner", prefix=prefix)
    other = RedisRunBus(url, replica_id="bench-other", prefix=prefix)
    await owner.open()
    await other.open()
    try:
        _, local_cpu, _ = await _play(LocalRunBus(), None, streams, deltas, interval_s)
        round_trip = await _round_trip_us(owner, min(deltas, 500), interval_s / streams)
        added, bus_cpu, (server_cpu, calls, usec) = await _play(
            owner, other, streams, deltas, interval_s
        )
        round_trip = min(
            round_trip, await _round_trip_us(owner, min(deltas, 500), interval_s / streams)
        )
    finally:
        await other.close()
        await owner.close()
    total = streams * (deltas + 4)
    added_p50 = statistics.median(added)
    return {
        "streams": streams,
        "deltas": deltas,
        "interval_ms": interval_s * 1000,
        "load_average": os.getloadavg()[0],
        "added_p50_us": added_p50,
        "added_p90_us": percentile(added, 0.9),
        "added_p99_us": percentile(added, 0.99),
        "round_trip_p50_us": round_trip,
        "added_over_round_trip": added_p50 / round_trip,
        "local_cpu_us_per_event": local_cpu / total * 1e6,
        "redis_cpu_us_per_event": (bus_cpu + server_cpu) / total * 1e6,
        "added_cpu_us_per_event": (bus_cpu + server_cpu - local_cpu) / total * 1e6,
        "redis_server_cpu_us_per_event": server_cpu / total * 1e6,
        "append_calls_per_event": calls / total,
        "append_script_us_per_event": usec / total,
        "target_added_over_round_trip": TARGET_RATIO,
    }


def markdown(figures: dict[str, Any]) -> str:
    ratio, target = figures["added_over_round_trip"], figures["target_added_over_round_trip"]
    met = "met" if ratio <= target else "NOT met"
    title = (
        f"### Redis hop ({figures['streams']} streams × {figures['deltas']} deltas, "
        f"one every {figures['interval_ms']:g} ms each)"
    )
    return "\n".join(
        [
            title,
            "",
            "| per delta | µs |",
            "|---|---|",
            f"| added latency, remote vs local follower, p50 | {figures['added_p50_us']:.0f} |",
            f"| added latency, p90 | {figures['added_p90_us']:.0f} |",
            f"| added latency, p99 | {figures['added_p99_us']:.0f} |",
            f"| a Redis round trip (PING) at the same pace, p50: the floor on this host | "
            f"{figures['round_trip_p50_us']:.0f} |",
            f"| CPU, in-process bus (owner + local follower) | "
            f"{figures['local_cpu_us_per_event']:.1f} |",
            f"| CPU, Redis bus (+ publisher, remote follower, redis-server) | "
            f"{figures['redis_cpu_us_per_event']:.1f} |",
            f"| CPU added by the Redis hop | {figures['added_cpu_us_per_event']:.1f} |",
            f"| of which redis-server (its used_cpu) | "
            f"{figures['redis_server_cpu_us_per_event']:.1f} |",
            f"| of which the append script (INFO commandstats) | "
            f"{figures['append_script_us_per_event']:.1f} |",
            f"| append script calls per event | {figures['append_calls_per_event']:.3f} |",
            "",
            f"Target: added latency p50 ≤ {target:g}× a PING round trip: "
            f"{ratio:.2f}× ({met}); load average {figures['load_average']:.2f}.",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.redis_hop", description=__doc__)
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--deltas", type=int, default=250, help="per stream")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="between a stream's deltas")
    parser.add_argument("--redis-url", default="", help="default: a throwaway redis-server")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        url = args.redis_url or stack.enter_context(throwaway_redis())
        figures = asyncio.run(measure(url, args.deltas, args.interval_ms / 1000, args.streams))
    print(json.dumps(figures, indent=2) if args.json else markdown(figures))


if __name__ == "__main__":
    main()
