"""The measurements, each run against one server under test.

Every scenario takes the server's process (`Child`), the provider's, a load
`Target` and the sizes, and returns flat figures. CPU is the process's own
(`getrusage` over its control channel) between two snapshots taken right
before the first call and right after the last stream ended.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bench.load import StreamResult, Target, open_streams, run_stream
from bench.options import Sizes
from bench.procs import Child
from bench.protocol import StreamSpec

Figures = dict[str, Any]
IDLE_HOLD_S = 60.0  # an idle stream's silence; the client closes it long before
SETTLE_S = 10.0
SUSTAINED = 0.95  # share of their pace at which streams must be delivered to count as sustained


def percentile(values: Iterable[float], pct: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = max(1, min(len(ordered), round(pct / 100 * len(ordered) + 0.5 - 1e-9)))
    return float(ordered[rank - 1])


def _own_cpu_ns() -> int:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return round((usage.ru_utime + usage.ru_stime) * 1e9)


@dataclass
class Usage:
    """CPU time (ns) of each process and wall time (ns) of a measured window."""

    server_ns: int
    provider_ns: int
    client_ns: int
    wall_ns: int

    def share(self, cpu_ns: int) -> float:
        """Cores used on average over the window."""
        return cpu_ns / self.wall_ns if self.wall_ns else 0.0


class Meter:
    """Snapshots of the server's, the provider's and our own CPU around a window."""

    def __init__(self, server: Child, provider: Child) -> None:
        self.server = server
        self.provider = provider
        self._start: tuple[int, int, int, int] = (0, 0, 0, 0)

    async def _snapshot(self) -> tuple[int, int, int, int]:
        server, provider = await asyncio.gather(self.server.stats(), self.provider.stats())
        return server["cpu_ns"], provider["cpu_ns"], _own_cpu_ns(), time.monotonic_ns()

    async def start(self) -> None:
        self._start = await self._snapshot()

    async def stop(self) -> Usage:
        end = await self._snapshot()
        return Usage(*(b - a for a, b in zip(self._start, end, strict=True)))


def _errors(results: list[StreamResult], deltas_each: int) -> int:
    return sum(1 for r in results if r.error or r.deltas != deltas_each)


def _first_error(results: list[StreamResult]) -> str:
    return next((r.error for r in results if r.error), "")


async def _streams(target: Target, specs: list[StreamSpec], batch: int) -> list[StreamResult]:
    return list(await asyncio.gather(*await open_streams(target, specs, batch)))


def _spread(
    streams: int, deltas: int, interval_ms: float, stagger_ms: float = 0.0
) -> list[StreamSpec]:
    """Paced streams whose deltas are spread evenly over the interval, as independent users'.

    With `stagger_ms`, their starts are also spread over that long (by whole intervals),
    as independent users' are, rather than all within the first interval.
    """
    waves = max(1, int(stagger_ms // interval_ms)) if interval_ms > 0 else 1
    return [
        StreamSpec(
            deltas,
            interval_ms,
            phase_ms=i * interval_ms / streams + (i * waves // streams) * interval_ms,
        )
        for i in range(streams)
    ]


def _pace(results: list[StreamResult], deltas: int, interval_ms: float) -> float:
    """How fast the streams were delivered against their pace: the sum of their scheduled
    spans (first to last delta) over the sum of the spans they took to arrive; 1 = on pace.

    Each stream is timed from its own first delta, so the figure is that of the steady
    flow, whenever each stream started."""
    scheduled = taken = 0.0
    for r in results:
        if len(r.arrivals) == deltas and deltas > 1:
            scheduled += (deltas - 1) * interval_ms * 1e6
            taken += r.arrivals[-1][0] - r.arrivals[0][0]
    return scheduled / taken if taken > 0 else 0.0


async def warmup(server: Child, provider: Child, target: Target, sizes: Sizes) -> Figures:
    """Connections, pools and lazy imports, before anything is measured."""
    await target.ready()
    results = await _streams(
        target, [StreamSpec(sizes.warmup_deltas)] * sizes.warmup_streams, sizes.batch
    )
    for _ in range(5):
        results.append(await run_stream(target, StreamSpec(1)))
    if any(r.error for r in results):
        raise RuntimeError(f"{server.kind}: warm-up failed: {_first_error(results)}")
    return {}


async def idle(server: Child, provider: Child, target: Target, sizes: Sizes) -> Figures:
    """RSS per open stream: open N streams that went silent after one delta."""
    n = sizes.idle_streams
    connections = (await provider.stats())["open_connections"]
    before = (await server.stats())["rss_kib"]
    release = asyncio.Event()
    tasks = await open_streams(
        target, [StreamSpec(1, hold_s=IDLE_HOLD_S)] * n, sizes.batch, release
    )
    after = (await server.stats())["rss_kib"]
    release.set()
    results = list(await asyncio.gather(*tasks))
    await _settle(provider, connections)
    return {
        "rss_kib_per_stream": (after - before) / n,
        "idle_streams": n,
        "idle_errors": _errors(results, 1),
    }


async def _settle(provider: Child, connections: int) -> None:
    """Wait (bounded) until the provider saw the cancelled streams' connections close."""
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        if (await provider.stats())["open_connections"] <= connections:
            return
        await asyncio.sleep(0.05)


async def ttfe(server: Child, provider: Child, target: Target, sizes: Sizes) -> Figures:
    """Time to first event, one call at a time: call start → first delta, and → any event.

    Also the server's CPU per call: each is a run of one delta, so this is
    where what a run costs besides its deltas weighs most.
    """
    first_delta: list[float] = []
    first_event: list[float] = []
    errors = 0
    meter = Meter(server, provider)
    await meter.start()
    for _ in range(sizes.ttfe_calls):
        result = await run_stream(target, StreamSpec(1))
        if result.error or not result.arrivals:
            errors += 1
            continue
        first_delta.append((result.arrivals[0][0] - result.started_ns) / 1e6)
        first_event.append((result.first_event_ns - result.started_ns) / 1e6)
    usage = await meter.stop()
    # The same calls to a provider whose first token takes `ttft_ms` (as real models'
    # does): what the gateway does before the upstream call, or in its way, shows here.
    slow: list[float] = []
    for _ in range(sizes.ttfe_calls if sizes.ttft_ms > 0 else 0):
        result = await run_stream(target, StreamSpec(1, phase_ms=sizes.ttft_ms))
        if result.error or not result.arrivals:
            errors += 1
            continue
        slow.append((result.arrivals[0][0] - result.started_ns) / 1e6)
    figures: Figures = {
        "cpu_us_per_call": usage.server_ns / 1e3 / sizes.ttfe_calls if sizes.ttfe_calls else 0.0,
        "ttfe_p50_ms": percentile(first_delta, 50),
        "ttfe_p99_ms": percentile(first_delta, 99),
        "first_event_p50_ms": percentile(first_event, 50),
        "ttfe_errors": errors,
    }
    if slow:
        figures["ttfe_slow_p50_ms"] = percentile(slow, 50)
    return figures


async def latency(server: Child, provider: Child, target: Target, sizes: Sizes) -> Figures:
    """Per-delta latency (send → arrival) under a light paced load."""
    specs = _spread(sizes.latency_streams, sizes.latency_deltas, sizes.latency_interval_ms)
    meter = Meter(server, provider)
    await meter.start()
    results = await _streams(target, specs, sizes.batch)
    usage = await meter.stop()
    lat = [x / 1e3 for r in results for x in r.latencies_ns()]
    delivered = len(lat)
    return {
        "latency_p50_us": percentile(lat, 50),
        "latency_p99_us": percentile(lat, 99),
        "cpu_us_per_delta_light": usage.server_ns / 1e3 / delivered if delivered else 0.0,
        "latency_errors": _errors(results, sizes.latency_deltas),
    }


async def bulk(server: Child, provider: Child, target: Target, sizes: Sizes) -> Figures:
    """CPU per delta when the provider sends everything at once (many deltas per read)."""
    specs = [StreamSpec(sizes.bulk_deltas)] * sizes.bulk_streams
    meter = Meter(server, provider)
    await meter.start()
    results = await _streams(target, specs, sizes.batch)
    usage = await meter.stop()
    delivered = sum(r.deltas for r in results)
    return {
        "cpu_us_per_delta_bulk": usage.server_ns / 1e3 / delivered if delivered else 0.0,
        "bulk_deltas_per_s": delivered / (usage.wall_ns / 1e9) if usage.wall_ns else 0.0,
        "bulk_errors": _errors(results, sizes.bulk_deltas),
    }


async def _paced(
    server: Child, provider: Child, target: Target, streams: int, deltas: int, sizes: Sizes
) -> Figures:
    """`streams` streams of `deltas` deltas paced like a real model, spread over the interval."""
    interval = sizes.load_interval_ms
    specs = _spread(streams, deltas, interval, sizes.stagger_ms)
    meter = Meter(server, provider)
    await meter.start()
    results = await _streams(target, specs, sizes.batch)
    usage = await meter.stop()
    lat = [x / 1e6 for r in results for x in r.latencies_ns()]
    lags = [x / 1e6 for r in results for x in r.lags_ns()]
    delivered, expected = len(lat), streams * deltas
    offered = streams * 1000 / interval
    span = _delivery_span_s(results)
    rate = (delivered - 1) / span if span > 0 else 0.0
    pace = _pace(results, deltas, interval)
    errors = _errors(results, deltas)
    return {
        "cpu_us_per_delta_load": usage.server_ns / 1e3 / delivered if delivered else 0.0,
        "load_latency_p50_ms": percentile(lat, 50),
        "load_latency_p99_ms": percentile(lat, 99),
        "load_latency_max_ms": max(lat, default=0.0),
        "load_rate_per_s": rate,
        "load_span_s": span,
        "load_scheduled_s": deltas * interval / 1000,
        "load_streams": streams,
        "load_offered_per_s": offered,
        "load_delivered": delivered,
        "load_expected": expected,
        "load_errors": errors,
        "load_first_error": _first_error(results),
        "load_pace": pace,
        "load_sustained": errors == 0 and delivered == expected and pace >= SUSTAINED,
        "load_server_cores": usage.share(usage.server_ns),
        "load_provider_cores": usage.share(usage.provider_ns),
        "load_client_cores": usage.share(usage.client_ns),
        "load_provider_lag_p99_ms": percentile(lags, 99),
    }


async def load(server: Child, provider: Child, target: Target, sizes: Sizes) -> Figures:
    """`load_streams` paced streams of `load_deltas`: sustained or not, latency, CPU per delta.

    The suite runs it at a rate that the servers compared sustain (see `capacity`).
    """
    return await _paced(server, provider, target, sizes.load_streams, sizes.load_deltas, sizes)


async def capacity(server: Child, provider: Child, target: Target, sizes: Sizes) -> Figures:
    """The highest paced rate the server sustains: steps of ever more streams, to the first
    one it does not sustain twice in a row (or `ramp_max_streams`). Each step:
    `ramp_deltas` deltas per stream.
    """
    steps: list[Figures] = []
    best = 0
    for streams in range(sizes.ramp_streams, sizes.ramp_max_streams + 1, max(1, sizes.ramp_step)):
        step = await _paced(server, provider, target, streams, sizes.ramp_deltas, sizes)
        if not step["load_sustained"]:  # a hiccup of the shared machine gets a second chance
            step = await _paced(server, provider, target, streams, sizes.ramp_deltas, sizes)
        steps.append(
            {
                "streams": streams,
                "offered_per_s": step["load_offered_per_s"],
                "rate_per_s": step["load_rate_per_s"],
                "pace": step["load_pace"],
                "sustained": step["load_sustained"],
                "cpu_us_per_delta": step["cpu_us_per_delta_load"],
                "latency_p99_ms": step["load_latency_p99_ms"],
                "errors": step["load_errors"],
            }
        )
        if not step["load_sustained"]:
            break
        best = streams
    return {
        "capacity_streams": best,
        "capacity_per_s": best * 1000 / sizes.load_interval_ms,
        "capacity_steps": steps,
    }


def _delivery_span_s(results: list[StreamResult]) -> float:
    """Seconds from the first delta's arrival to the last one's, over all streams."""
    arrivals = [r.arrivals for r in results if r.arrivals]
    if not arrivals:
        return 0.0
    first = min(a[0][0] for a in arrivals)
    last = max(a[-1][0] for a in arrivals)
    return (last - first) / 1e9


# The scenarios measuring CPU and time to first delta, repeated to compare the gateway's
# variants closely (and to see how much the figures vary from one run to the next).
REPEATED = ("ttfe", "latency", "bulk", "load")

SCENARIOS = {
    "warmup": warmup,
    "idle": idle,
    "ttfe": ttfe,
    "latency": latency,
    "bulk": bulk,
    "capacity": capacity,
    "load": load,
}
