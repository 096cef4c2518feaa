"""One benchmark run: start the provider and the servers, run every scenario, collect figures.

All processes run at once: the fake provider, each server under test (bare
baseline, relays, the gateway's variants) and this process as the load client.
Scenarios run one after the other; each goes through every server before the
next scenario starts, so that the figures compared with each other are
measured minutes — not hours — apart on a machine that others share.

The capacity ramp finds the highest paced rate the gateway and the aiohttp
relay (`RAMPED`) each sustain; the paced load then runs one step below the
highest rate both sustained, so that its figures — CPU per delta above all —
compare sustained runs, never a saturated one. The ramp's steps are short: a
server whose backlog builds slowly passes a step it cannot sustain for the
load's length, so a load that one of them did not sustain runs again one step
lower (twice at most).

The gateway's variants are then compared more closely: the scenarios measuring
CPU and time to first delta (`REPEATED`) run again on each of them, `rounds`
times in all, the variants' order rotating from one round to the next (each
scenario still runs on every variant before the next scenario starts, so that
the figures compared are seconds apart); `rounds[kind]` holds the figures of
each round (the first one is the main pass), and `telemetry[kind]` what its
telemetry did in the whole run (spans and metric collections exported).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import platform
import sys
import time
from typing import Any

from bench.load import Target
from bench.options import Options, Sizes
from bench.procs import Child, spawn
from bench.protocol import GATEWAYS, PACED_AT_COMMON_RATE, RAMPED
from bench.scenarios import REPEATED, SCENARIOS, Figures
from service.process import eventloop


def _loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def _expected_s(options: Options) -> float:
    """A generous bound on a whole run, from the sizes (the run fails beyond it)."""
    s = options.sizes
    paced = (s.load_deltas * s.load_interval_ms + s.latency_deltas * s.latency_interval_ms) / 1e3
    repeated = (paced + 60.0) * (s.rounds - 1)
    steps = max(0, s.ramp_max_streams - s.ramp_streams) // max(1, s.ramp_step) + 1
    ramp = (s.ramp_deltas * s.load_interval_ms / 1e3 + 10.0) * steps * len(RAMPED)
    return (paced + 60.0) * 3 * len(options.servers) + repeated * len(GATEWAYS) + ramp + 120.0


async def run_suite(options: Options) -> dict[str, Any]:
    """Measure every scenario on every server; the raw figures and the run's context."""
    started = time.time()
    meta: dict[str, Any] = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_before": _loadavg(),
        "quick": options.quick,
        "sizes": dataclasses.asdict(options.sizes),
        "servers": list(options.servers),
        "event_loop": eventloop.loop_name(os.environ.get("AGW_EVENT_LOOP", "auto")),
    }
    async with asyncio.timeout(_expected_s(options)), contextlib.AsyncExitStack() as stack:
        provider = await spawn("provider", *_profile(options, "provider"))
        stack.push_async_callback(provider.stop)
        url = f"http://127.0.0.1:{provider.port}/v1"
        max_streams = str(max(options.sizes.idle_streams, options.sizes.load_streams) + 100)
        spawned = await asyncio.gather(
            *(
                spawn(
                    kind,
                    "--provider-url",
                    url,
                    "--max-streams",
                    max_streams,
                    *_profile(options, kind),
                )
                for kind in options.servers
            ),
            return_exceptions=True,
        )
        servers: dict[str, Child] = {}
        for kind, child in zip(options.servers, spawned, strict=True):
            if isinstance(child, BaseException):
                continue
            servers[kind] = child
            stack.push_async_callback(child.stop)
        for child in spawned:
            if isinstance(child, BaseException):
                raise child
        targets: dict[str, Target] = {}
        for kind, child in servers.items():
            targets[kind] = Target(kind, child.port, options.sizes.channels)
            stack.push_async_callback(targets[kind].close)
        figures: dict[str, Figures] = {kind: {} for kind in servers}
        variants = [kind for kind in servers if kind in GATEWAYS]
        rounds: dict[str, list[Figures]] = {kind: [{}] for kind in variants}
        sizes = first = options.sizes
        for name, scenario in SCENARIOS.items():
            if name == "load":
                sizes = first = _at_common_rate(options.sizes, figures)
                meta["load_first_streams"] = first.load_streams
            while True:
                for kind, child in servers.items():
                    if name == "capacity" and kind not in RAMPED:
                        continue
                    _progress(f"{name:<8} {kind}")
                    measured = await scenario(child, provider, targets[kind], sizes)
                    figures[kind].update(measured)
                    if kind in rounds and name in REPEATED:
                        rounds[kind][0].update(measured)
                if name != "load" or not (lower := _step_down(sizes, first, figures)):
                    break
                sizes = lower  # the ramp's short steps overrated it: one step lower, again
            if name == "load":
                meta["load_streams"] = sizes.load_streams
        for number in range(1, options.sizes.rounds if len(variants) > 1 else 1):
            order = variants[number % len(variants) :] + variants[: number % len(variants)]
            for kind in order:
                rounds[kind].append({})
            for name in REPEATED:
                for kind in order:
                    _progress(f"{name:<7} {kind} (round {number + 1})")
                    rounds[kind][number].update(
                        await SCENARIOS[name](servers[kind], provider, targets[kind], sizes)
                    )
        telemetry = {kind: _telemetry(await servers[kind].flush()) for kind in variants}
    meta["loadavg_after"] = _loadavg()
    meta["duration_s"] = round(time.time() - started, 1)
    return {"meta": meta, "servers": figures, "rounds": rounds, "telemetry": telemetry}


def _at_common_rate(sizes: Sizes, figures: dict[str, Figures]) -> Sizes:
    """The sizes of the paced load: as many streams as one step below the highest step of
    the capacity ramp that every server of `PACED_AT_COMMON_RATE` in this run sustained
    (a margin, as the load runs longer than a step), at most `load_streams`.

    Never below the ramp's first step: a server that sustained none counts as the first
    step (its load then shows it is not sustained); with none of those servers in the
    run, `load_streams` as given.
    """
    ramped = [
        max(sizes.ramp_streams, int(figures[kind]["capacity_streams"]) - sizes.ramp_step)
        for kind in PACED_AT_COMMON_RATE
        if "capacity_streams" in figures.get(kind, {})
    ]
    streams = min([sizes.load_streams, *ramped])
    return dataclasses.replace(sizes, load_streams=streams)


def _step_down(sizes: Sizes, first: Sizes, figures: dict[str, Figures]) -> Sizes | None:
    """The paced load one ramp step lower, when a server of `PACED_AT_COMMON_RATE` did not
    sustain it (a ramp step's streams are short: a backlog that builds slowly shows only in
    the load's longer ones), at most two steps below the `first` load and never below the
    ramp's first step; else None."""
    saturated = any(
        not figures.get(kind, {}).get("load_sustained", True) for kind in PACED_AT_COMMON_RATE
    )
    lower = sizes.load_streams - sizes.ramp_step
    if not saturated or lower < max(sizes.ramp_streams, first.load_streams - 2 * sizes.ramp_step):
        return None
    return dataclasses.replace(sizes, load_streams=lower)


def _telemetry(stats: dict[str, Any]) -> dict[str, Any]:
    """A gateway variant's telemetry counters (spans exported...), its buffers flushed first."""
    return {key: value for key, value in stats.items() if key.startswith("otel_")}


def _profile(options: Options, kind: str) -> list[str]:
    if options.profile_dir is None:
        return []
    options.profile_dir.mkdir(parents=True, exist_ok=True)
    return ["--profile", str(options.profile_dir / f"{kind}.prof")]


def _progress(message: str) -> None:
    print(f"bench: {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)
