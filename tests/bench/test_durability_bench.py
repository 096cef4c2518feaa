"""The durability benchmark at tiny sizes: both gateways serve paced streams and calls, and
runs in flight on a killed replica resume on the others.

Not a performance test (CPU figures at these sizes are ticks): it checks that the
benchmark works end to end — its own processes, real PostgreSQL and Redis on loopback,
a replica killed with SIGKILL — and that its figures are all there.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.durability import CHECKPOINT_TARGET, markdown, measure


async def test_the_durability_bench_reports_the_checkpoint_cost_and_resume_latency(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGW_BENCH_DATA_ROOT", str(tmp_path / "data"))
    args = argparse.Namespace(
        rounds=1, streams=4, deltas=10, interval_ms=20.0, calls=8, runs=3, lease=1.0
    )
    figures = await measure(args)
    cost, resume = figures["checkpoint"], figures["resume"]
    assert set(cost["cpu_per_delta_us"]) == {"journaled", "not journaled"}
    assert cost["met"] == (cost["delta_ratio"] <= CHECKPOINT_TARGET)
    assert (resume["runs"], resume["resumed"]) == (3, 3)  # every run killed went on
    assert 0 < resume["p50_s"] <= resume["p99_s"] <= resume["max_s"]
    assert "kill → `run.resume` at a follower" in markdown(figures)
