"""`python -m bench.soak`: the memory a gateway keeps per run served, over thousands of runs.

A gateway process (the bench's, on its loopback provider) serves short runs one
after another (one delta each, the shortest a run gets: its fixed cost is all
there is). After a warm-up, its resident set size (VmRSS) is read; after `runs`
more, again, once the last ones are released: ended runs stay in memory for
`--retention` seconds (AGW_RUN_RETENTION_S, 60 by default in production; shorter
here to keep the soak short, but long enough that a run outlives the garbage
collector's young generations, as it does in production). The growth divided by
the runs is what each run left behind: with every ended run freed at its release,
it tends to 0 (the allocator keeps some pages; the target allows for that).

Then what an ended run costs while it is kept: a second gateway, whose retention
outlasts the soak (`KEPT_RETENTION_S`), serves as many runs after its warm-up; the
growth of its RSS divided by those runs, all still kept, is the memory each kept
run holds (its state, its log's events, its task's end) for AGW_RUN_RETENTION_S.

    python -m bench.soak [--quick] [--runs 3000] [--warmup 500] [--retention 5]

Prints the figures in Markdown and, with `--out`, writes them as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from bench.load import Target, run_stream
from bench.procs import Child, spawn
from bench.protocol import HOST, StreamSpec
from service.process import eventloop

TARGET_KIB_PER_RUN = 8.0
#: What a kept run (ended, not released yet) may hold: a fifth of the open stream's budget
#: (bench/report.py, 50 KiB), so that a minute of runs at 100 runs/s is ~100 MiB at most.
TARGET_KIB_PER_KEPT_RUN = 16.0
KEPT_RETENTION_S = 3600.0  # longer than the soak: every run served is still kept


def rss_kib(pid: int) -> int:
    """The process's resident set size, in KiB (`/proc/PID/status`, VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


async def serve_runs(target: Target, count: int) -> float:
    """Serve `count` one-delta runs one after another; how long it took, in seconds."""
    spec = StreamSpec(deltas=1)
    started = time.monotonic()
    for _ in range(count):
        result = await run_stream(target, spec)
        if result.error:
            raise RuntimeError(f"a run failed: {result.error}")
    return time.monotonic() - started


async def soak(runs: int, warmup: int, retention_s: float) -> dict[str, Any]:
    provider = await spawn("provider")
    try:
        before, after, seconds = await _served(provider, runs, warmup, retention_s)
        kept_before, kept_after, _ = await _served(provider, runs, warmup, KEPT_RETENTION_S)
    finally:
        await provider.stop()
    per_run = (after - before) / runs
    per_kept_run = (kept_after - kept_before) / runs
    return {
        "runs": runs,
        "warmup": warmup,
        "retention_s": retention_s,
        "rss_before_kib": before,
        "rss_after_kib": after,
        "growth_kib_per_run": round(per_run, 3),
        "runs_per_s": round(runs / seconds, 1),
        "target_kib_per_run": TARGET_KIB_PER_RUN,
        "met": per_run < TARGET_KIB_PER_RUN,
        "kept_rss_before_kib": kept_before,
        "kept_rss_after_kib": kept_after,
        "kib_per_kept_run": round(per_kept_run, 3),
        "target_kib_per_kept_run": TARGET_KIB_PER_KEPT_RUN,
        "kept_met": per_kept_run <= TARGET_KIB_PER_KEPT_RUN,
    }


async def _served(
    provider: Child, runs: int, warmup: int, retention_s: float
) -> tuple[int, int, float]:
    """A gateway keeping ended runs `retention_s`: its RSS after `warmup` runs (released,
    unless the retention outlasts the soak) and after `runs` more, and how long they took.

    With a retention outlasting the soak, the second figure is read once the runs' ends
    are kept (a second after the last): all of them are held then, none released."""
    gateway = await spawn(
        "gateway",
        "--provider-url",
        f"http://{HOST}:{provider.port}/v1",
        env={"AGW_RUN_RETENTION_S": f"{retention_s:g}"},
    )
    try:
        target = Target("gateway", gateway.port, channels=1)
        await target.ready()
        settle_s = 1.0 if retention_s >= KEPT_RETENTION_S else retention_s + 1.0
        try:
            await serve_runs(target, warmup)
            await asyncio.sleep(settle_s)  # the warm-up's runs released (or all kept)
            before = rss_kib(gateway.pid)
            seconds = await serve_runs(target, runs)
            await asyncio.sleep(settle_s)
            after = rss_kib(gateway.pid)
        finally:
            await target.close()
    finally:
        await gateway.stop()
    return before, after, seconds


def markdown(figures: dict[str, Any]) -> str:
    met = "met" if figures["met"] else "**not met**"
    kept_met = "met" if figures["kept_met"] else "**not met**"
    return "\n".join(
        [
            "| figure | value | target | met |",
            "|---|---|---|---|",
            f"| RSS growth per run, {figures['runs']:,} runs after {figures['warmup']:,} "
            f"(retention {figures['retention_s']:g} s, KiB) "
            f"| {figures['growth_kib_per_run']:.2f} | < {TARGET_KIB_PER_RUN:g} | {met} |",
            f"| RSS before → after (MiB) | {figures['rss_before_kib'] / 1024:.1f} → "
            f"{figures['rss_after_kib'] / 1024:.1f} | | |",
            f"| memory per kept run: RSS growth over {figures['runs']:,} ended runs all "
            f"kept (retention {KEPT_RETENTION_S:g} s, KiB) | {figures['kib_per_kept_run']:.2f} "
            f"| ≤ {TARGET_KIB_PER_KEPT_RUN:g} | {kept_met} |",
            f"| RSS before → after, runs kept (MiB) | "
            f"{figures['kept_rss_before_kib'] / 1024:.1f} → "
            f"{figures['kept_rss_after_kib'] / 1024:.1f} | | |",
            f"| runs served per second, one at a time | {figures['runs_per_s']:,} | | |",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--runs", type=int, default=3000, help="runs measured after the warm-up")
    parser.add_argument("--warmup", type=int, default=500, help="runs served before measuring")
    parser.add_argument("--retention", type=float, default=5.0, help="AGW_RUN_RETENTION_S")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    runs, warmup = (200, 50) if args.quick else (args.runs, args.warmup)
    figures = eventloop.run(
        soak(runs, warmup, args.retention), os.environ.get("AGW_EVENT_LOOP", "auto")
    )
    if args.out is not None:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(markdown(figures))


if __name__ == "__main__":
    main()
