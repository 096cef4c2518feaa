"""The benchmark at tiny sizes: every scenario runs on every server, every figure is there.

Not a timing test: it checks that the benchmark still works end to end (its
own processes, real sockets on loopback) and that its report is complete —
including the gateway's variants with and without instrumentation, their
repeated rounds and the "tracing on vs off" section.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bench import overhead, report
from bench.__main__ import run
from bench.options import QUICK, parse
from bench.protocol import GATEWAYS, SERVERS

NONE = "gateway-no-otel"

# Some of the figures of the repeated scenarios (ttfe, latency, bulk, load).
REPEATED_KEYS = {row.key for row in overhead.ROWS} - {"rss_kib_per_stream"}
ROUND_ERRORS = ("ttfe_errors", "latency_errors", "bulk_errors", "load_errors")


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


async def test_quick_run_reports_every_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGW_BENCH_DATA_ROOT", str(tmp_path / "data"))  # the gateway's files
    out = tmp_path / "results" / "latest.json"
    results = await run(parse(["--quick", "--out", str(out)]))

    assert set(results["servers"]) == set(SERVERS)
    assert set(GATEWAYS) == set(overhead.VARIANTS) <= set(SERVERS)
    for kind, figures in results["servers"].items():
        for fig in report.FIGURES:
            value = figures.get(fig.key)
            if fig.only is not None and kind not in fig.only:
                assert value is None, (kind, fig.key, value)
            elif fig.key == "capacity_per_s":  # 0 when not even the first step was sustained
                assert _number(value) and value >= 0, (kind, fig.key, value)
                steps = figures["capacity_steps"]
                assert steps and all(isinstance(step["sustained"], bool) for step in steps)
                assert value == figures["capacity_streams"] * 1000 / QUICK.load_interval_ms
            else:
                assert _number(value) and value > 0, (kind, fig.key, value)
        assert isinstance(figures["load_sustained"], bool)
        assert figures["load_streams"] == results["meta"]["load_streams"], kind
        assert [figures[key] for key in report.ERROR_KEYS] == [0] * len(report.ERROR_KEYS), kind

    assert results["meta"]["event_loop"] in ("asyncio", "uvloop")
    assert QUICK.ramp_streams <= results["meta"]["load_streams"] <= QUICK.load_streams
    for fig in report.FIGURES:
        if fig.key == "capacity_per_s":
            continue  # a ratio of 0s when the first step of the ramp was not sustained
        row = results["comparisons"][fig.key]
        bases = ("relay-aiohttp", "relay", "relay-contract", "bare")
        keys = [f"gateway/{b}" for b in bases] + ["httpx/aiohttp", "contract/aiohttp"]
        if fig.compare == "added":
            keys = [f"gateway-{b}" for b in bases]
        for key in keys:
            assert _number(row[key]), (fig.key, key)
            if fig.compare == "ratio":
                assert row[key] > 0, (fig.key, key)

    assert [t["name"] for t in results["targets"]] == [t.name for t in report.TARGETS]
    for target in results["targets"]:
        assert isinstance(target["met"], bool) and isinstance(target["note"], str)
        assert _number(target["value"]), target
    goals = {t["name"]: t["goal"] for t in results["targets"]}
    assert goals["CPU per delta, paced load (sustained)"] == "≤ 1.15× relay"
    assert goals["CPU per 1-delta call (a run's fixed cost)"] == "≤ 2× relay"
    assert goals["added time to first delta p50"] == "≤ 1 ms"
    assert goals["added time to first delta p50, provider TTFT 20 ms"] == "≤ 0.3 ms"
    slow = {kind: figures["ttfe_slow_p50_ms"] for kind, figures in results["servers"].items()}
    assert all(p50 >= QUICK.ttft_ms for p50 in slow.values()), slow  # the provider waited

    _check_rounds(results)
    _check_tracing(results["tracing"])

    written = json.loads(out.read_text())
    assert written["servers"] == results["servers"]
    assert written["tracing"] == results["tracing"]
    markdown = out.with_suffix(".md").read_text()
    assert all(fig.label in markdown for fig in report.FIGURES)
    assert "| relay (aiohttp) | relay (aiohttp, contract events) | gateway |" in markdown
    floor = results["comparisons"]["cpu_us_per_call"]["contract/aiohttp"]
    assert f"contract's 7 events per 1-delta run: relay-contract ÷ relay = {floor:.2f}×" in markdown
    assert all(t.name in markdown for t in report.TARGETS)
    assert "### Tracing on vs off" in markdown
    assert all(row.label in markdown for row in overhead.ROWS)
    assert all(label in markdown for label in overhead.VARIANTS.values())


def _check_rounds(results: dict[str, Any]) -> None:
    """Each variant ran the scenarios once per round; the first round is the main pass."""
    assert QUICK.rounds >= 2
    assert set(results["rounds"]) == set(GATEWAYS)
    for kind, rounds in results["rounds"].items():
        assert len(rounds) == QUICK.rounds, kind
        main = results["servers"][kind]
        assert rounds[0] == {key: main[key] for key in rounds[0]}, kind
        assert REPEATED_KEYS | set(ROUND_ERRORS) <= set(rounds[0]), kind
        for figures in rounds:
            assert set(figures) == set(rounds[0]), kind
            assert [figures[key] for key in ROUND_ERRORS] == [0] * len(ROUND_ERRORS), kind
            assert all(_number(figures[key]) for key in REPEATED_KEYS), kind


def _check_tracing(tracing: dict[str, Any]) -> None:
    """Every row has each variant's samples and both comparisons; the 5% targets are judged."""
    assert tracing["rounds"] == QUICK.rounds
    # Tracing on did trace (every span and metric collection reached the discarding
    # exporters); no instrumentation did replace the tracer, instruments and RPC span.
    telemetry = tracing["telemetry"]
    assert set(telemetry) == set(GATEWAYS)
    s = QUICK
    calls = s.warmup_streams + 5 + s.idle_streams
    calls += s.rounds * (s.ttfe_calls + s.latency_streams + s.bulk_streams + s.load_streams)
    assert telemetry["gateway+otel"]["otel_spans_exported"] >= calls  # one per RPC at least
    assert telemetry["gateway+otel"]["otel_metric_exports"] > 0
    removed = telemetry["gateway-no-otel"]["otel_names_removed"]
    assert removed > 0 and telemetry["gateway-no-otel-2"] == {"otel_names_removed": removed}
    assert telemetry["gateway"] == {"otel_names_removed": 0}
    for row in overhead.ROWS:
        repeated = row.key in REPEATED_KEYS
        for kind in GATEWAYS:
            stats = tracing["figures"][row.key][kind]
            assert len(stats["samples"]) == (QUICK.rounds if repeated else 1), (row.key, kind)
            assert 0 < stats["min"] <= stats["mean"] <= stats["max"], (row.key, kind)
            assert _number(stats["spread"]) if repeated else stats["spread"] is None
        comp = tracing["comparisons"][row.key]
        for key in overhead.COMPARED:
            assert _number(comp[key]) and comp[key] > 0, (row.key, key)
            assert _number(comp[key.replace("/", "-")]), (row.key, key)
            assert len(comp[f"{key} rounds"]) == (QUICK.rounds if repeated else 0), (row.key, key)

    targets = tracing["targets"]
    assert [t["key"] for t in targets] == [row.key for row in overhead.ROWS if row.target]
    for target in targets:
        rounds, again = target["rounds"], target["again"]
        assert len(rounds) == QUICK.rounds, target
        means = [tracing["figures"][target["key"]][kind]["mean"] for kind in ("gateway", NONE)]
        assert target["value"] == means[0] / means[1], target
        assert min(rounds) <= target["value"] <= max(rounds), target
        assert target["met"] == (target["value"] <= overhead.LIMIT), target
        assert _number(again) and again > 0, target
        noise = max((max(rounds) - min(rounds)) / 2, abs(again - 1))
        assert target["noise"] == noise, target
        if abs(target["value"] - overhead.LIMIT) <= noise:
            assert target["note"].startswith("not conclusive"), target
        elif noise > overhead.LIMIT - 1:
            assert target["note"].startswith("noise"), target
        else:
            assert target["note"] == "", target
