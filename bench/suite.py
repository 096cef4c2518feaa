"""One benchmark run: start the provider and the servers, run every scenario, collect figures.

All processes run at once: the fake provider, each server under test (bare
baseline, relays, gateway) and this process as the load client. Scenarios run
one after the other; each goes through every server before the next scenario
starts, so that the figures compared with each other are measured minutes —
not hours — apart on a machine that others share.
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
from bench.options import Options
from bench.procs import Child, spawn
from bench.scenarios import SCENARIOS, Figures


def _loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def _expected_s(options: Options) -> float:
    """A generous bound on a whole run, from the sizes (the run fails beyond it)."""
    s = options.sizes
    paced = (s.load_deltas * s.load_interval_ms + s.latency_deltas * s.latency_interval_ms) / 1e3
    return (paced + 60.0) * 3 * len(options.servers) + 120.0


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
        for name, scenario in SCENARIOS.items():
            for kind, child in servers.items():
                _progress(f"{name:<7} {kind}")
                figures[kind].update(await scenario(child, provider, targets[kind], options.sizes))
    meta["loadavg_after"] = _loadavg()
    meta["duration_s"] = round(time.time() - started, 1)
    return {"meta": meta, "servers": figures}


def _profile(options: Options, kind: str) -> list[str]:
    if options.profile_dir is None:
        return []
    options.profile_dir.mkdir(parents=True, exist_ok=True)
    return ["--profile", str(options.profile_dir / f"{kind}.prof")]


def _progress(message: str) -> None:
    print(f"bench: {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)
