"""The benchmark at tiny sizes: every scenario runs on every server, every figure is there.

Not a timing test: it checks that the benchmark still works end to end (its
own processes, real sockets on loopback) and that its report is complete.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from bench import report
from bench.__main__ import run
from bench.options import parse
from bench.protocol import SERVERS


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


async def test_quick_run_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "results" / "latest.json"
    results = await run(parse(["--quick", "--out", str(out)]))

    assert set(results["servers"]) == set(SERVERS)
    for kind, figures in results["servers"].items():
        for fig in report.FIGURES:
            value = figures.get(fig.key)
            assert _number(value) and value > 0, (kind, fig.key, value)
        assert isinstance(figures["load_sustained"], bool)
        assert [figures[key] for key in report.ERROR_KEYS] == [0] * len(report.ERROR_KEYS), kind

    for fig in report.FIGURES:
        row = results["comparisons"][fig.key]
        keys = ("gateway/relay", "gateway/bare", "httpx/aiohttp")
        if fig.compare == "added":
            keys = ("gateway-relay", "gateway-bare", "gateway-relay-aiohttp")
        for key in keys:
            assert _number(row[key]), (fig.key, key)
            if fig.compare == "ratio":
                assert row[key] > 0, (fig.key, key)

    assert [t["name"] for t in results["targets"]] == [t.name for t in report.TARGETS]
    for target in results["targets"]:
        assert isinstance(target["met"], bool) and isinstance(target["note"], str)
        assert _number(target["value"]), target

    written = json.loads(out.read_text())
    assert written["servers"] == results["servers"]
    markdown = out.with_suffix(".md").read_text()
    assert all(fig.label in markdown for fig in report.FIGURES)
    assert all(t.name in markdown for t in report.TARGETS)
