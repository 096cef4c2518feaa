"""The workers benchmark at tiny sizes: both worker counts ramp, every figure is there.

Not a timing test (the machine is shared); `python -m bench.workers` gives the figures.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench import workers


async def test_one_and_two_workers_are_ramped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGW_BENCH_DATA_ROOT", str(tmp_path / "data"))
    results = await workers.measure(workers.QUICK, rounds_=1)
    report = workers.markdown(results)
    print("\n" + report)
    assert set(results["workers"]) == {"1", "2"}
    for run in results["workers"].values():
        assert run["steps"] and run["steps"][0]["streams"] == workers.QUICK.ramp_streams
        for step in run["steps"]:
            assert isinstance(step["sustained"], bool)
            for key in ("rate_per_s", "service_cores", "client_cores", "machine_cores"):
                assert math.isfinite(step[key]) and step[key] >= 0, key
        assert run["capacity_per_s"] == run["capacity_streams"] * 50
        assert run["rounds_per_s"] == [run["capacity_per_s"]]
    one, two = (results["workers"][n]["capacity_per_s"] for n in ("1", "2"))
    assert results["ratio"] == (two / one if one else 0.0)
    assert results["met"] == (results["ratio"] >= 1.7)
    assert "2 workers ÷ 1 worker: **" in report


def test_equal_load_pairs_one_worker_at_n_streams_with_two_at_2n() -> None:
    def step(streams: int, us: float, sustained: bool = True) -> dict[str, object]:
        return {"streams": streams, "sustained": sustained, "cpu_us_per_delta": us}

    rounds = {
        "1": [{"steps": [step(40, 100.0), step(60, 110.0), step(80, 150.0, False)]}],
        "2": [{"steps": [step(40, 90.0), step(80, 120.0), step(120, 130.0, False)]}],
    }
    equal = workers.equal_load(rounds)  # 60 per worker: 2 x 60 = 120 was not sustained
    assert equal["streams_per_worker"] == 40
    assert (equal["one_worker_us_per_delta"], equal["two_workers_us_per_delta"]) == (100, 120)
    assert equal["ratio"] == 1.2 and not equal["met"]  # target 2 / 1.7 = 1.18
    assert workers.equal_load({"1": [], "2": []}) == {}
