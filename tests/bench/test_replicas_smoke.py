"""The 1-vs-3-replicas benchmark at a tiny size: every delta reaches its querying client and
its follower on another replica, and every figure is there.

Not a timing test (the machine is shared); `python -m bench.replicas` gives the figures.
"""

from __future__ import annotations

import math

from bench import replicas


async def test_one_process_and_three_replicas_are_measured_in_one_run() -> None:
    args = replicas.parse(["--streams", "3", "--deltas", "10", "--interval-ms", "5"])
    args.rounds = 1
    figures = await replicas.run(args)
    print("\n" + replicas.markdown(figures))
    for setup in ("single", "replicas"):
        measured = figures[setup]
        assert measured["errors"] == []
        assert measured["delivered"] == measured["followed"] == measured["expected"] == 30
        for key in ("cpu_per_delta_us", "query_p50_us", "follow_p50_us", "follow_p99_us"):
            assert math.isfinite(measured[key]) and measured[key] > 0, (setup, key)
    assert math.isfinite(figures["cpu_ratio"]) and figures["cpu_ratio"] > 0
    assert "| CPU per delta, every server process |" in replicas.markdown(figures)
