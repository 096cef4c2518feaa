"""The soak at tiny sizes: the gateway serves runs one after another and its memory is read.

Not a memory test (the figure is noisy at these sizes): it checks that the soak
still works end to end — its own processes, real sockets on loopback — and that
its figures are all there. The memory each run keeps is bounded by
tests/core/run/test_release.py, which counts live objects.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak import TARGET_KIB_PER_KEPT_RUN, TARGET_KIB_PER_RUN, markdown, soak


async def test_the_soak_reports_the_growth_per_run_and_the_memory_per_kept_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGW_BENCH_DATA_ROOT", str(tmp_path / "data"))
    figures = await soak(runs=40, warmup=10, retention_s=0.2)
    assert figures["runs"] == 40 and figures["warmup"] == 10
    assert figures["rss_before_kib"] > 10_000 and figures["rss_after_kib"] > 10_000
    assert figures["runs_per_s"] > 0
    assert figures["met"] == (figures["growth_kib_per_run"] < TARGET_KIB_PER_RUN)
    assert figures["kept_rss_after_kib"] > 10_000
    assert figures["kept_met"] == (figures["kib_per_kept_run"] <= TARGET_KIB_PER_KEPT_RUN)
    table = markdown(figures)
    assert "RSS growth per run, 40 runs after 10" in table
    assert "memory per kept run" in table
