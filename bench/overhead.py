"""What the gateway's instrumentation costs: its variants side by side.

"no instrumentation" (`gateway-no-otel`: the OpenTelemetry calls
short-circuited), "no exporter" (`gateway`: the default, the OpenTelemetry API
a no-op) and "tracing on" (`gateway+otel`: the SDK installed, exporters that
discard). The issue's target: with no exporter configured, instrumentation
costs at most 5% — no exporter ÷ no instrumentation ≤ 1.05 on each figure.

The scenarios measuring CPU and time to first delta run `rounds` times on
each variant, the variants' order rotating from round to round, so that over
a multiple of four rounds each variant ran as often in each place: what
drifts over the run (and it does, on a shared virtual machine) weighs on each
alike. A figure of a variant is the mean of its rounds (min–max next to it)
and two variants are compared by the ratio (or difference) of their means.

How far such a ratio can be trusted — its *noise*, ± — is the larger of two
things: half the range of the ratios of single rounds, and how much the same
variant differs from itself in a second process (`gateway-no-otel-2`; a
process's memory layout alone moves its figures by several percent). A
verdict is conclusive when the ratio is farther from the limit than that.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from bench.otel import WITH_SDK, WITHOUT_INSTRUMENTATION, WITHOUT_INSTRUMENTATION_AGAIN

NONE, AGAIN, OFF, ON = WITHOUT_INSTRUMENTATION, WITHOUT_INSTRUMENTATION_AGAIN, "gateway", WITH_SDK
VARIANTS = {
    NONE: "no instrumentation",
    AGAIN: "no instrumentation, 2nd process",
    OFF: "no exporter (default)",
    ON: "tracing on (SDK)",
}
COMPARED = {"on/off": (ON, OFF), "off/none": (OFF, NONE), "again/none": (AGAIN, NONE)}
LIMIT = 1.05


@dataclass(frozen=True)
class Row:
    """A figure compared across the variants; `target`: judged against the 5% limit."""

    key: str
    label: str
    digits: int
    target: bool


ROWS: tuple[Row, ...] = (
    Row("cpu_us_per_delta_load", "CPU per delta, paced load (µs)", 1, True),
    Row("cpu_us_per_delta_light", "CPU per delta, light paced (µs)", 1, True),
    Row("cpu_us_per_delta_bulk", "CPU per delta, bulk (µs)", 1, True),
    Row("cpu_us_per_call", "CPU per 1-delta call (µs)", 1, True),
    Row("ttfe_p50_ms", "time to first delta p50 (ms)", 2, True),
    Row("ttfe_p99_ms", "time to first delta p99 (ms)", 2, False),
    Row("latency_p50_us", "per-delta latency p50 (µs)", 0, False),
    Row("latency_p99_us", "per-delta latency p99 (µs)", 0, False),
    Row("rss_kib_per_stream", "RSS per open stream (KiB)", 1, False),
)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _samples(raw: dict[str, Any], kind: str, key: str) -> list[float]:
    """The figure's value in each round, else its one value from the main pass."""
    rounds = [float(r[key]) for r in raw.get("rounds", {}).get(kind, []) if _number(r.get(key))]
    if rounds:
        return rounds
    value = raw["servers"].get(kind, {}).get(key)
    return [float(value)] if _number(value) else []


def _stats(samples: list[float]) -> dict[str, Any]:
    mean = statistics.fmean(samples)
    spread = (max(samples) - min(samples)) / mean if len(samples) > 1 and mean else None
    return {
        "samples": samples,
        "mean": mean,
        "min": min(samples),
        "max": max(samples),
        "spread": spread,
    }


def _compare(a: list[float], b: list[float]) -> dict[str, Any]:
    """a against b: ratio and difference of the means, and the ratio in each round."""
    if not a or not b:
        return {}
    mean_a, mean_b = statistics.fmean(a), statistics.fmean(b)
    paired = len(a) == len(b) > 1
    return {
        "ratio": mean_a / mean_b if mean_b else None,
        "added": mean_a - mean_b,
        "rounds": [x / y for x, y in zip(a, b, strict=True) if y] if paired else [],
    }


def build(raw: dict[str, Any]) -> dict[str, Any]:
    """The section of the results document: per-variant figures, comparisons, 5% targets."""
    figures: dict[str, dict[str, Any]] = {}
    comparisons: dict[str, dict[str, Any]] = {}
    for row in ROWS:
        samples = {kind: _samples(raw, kind, row.key) for kind in VARIANTS}
        figures[row.key] = {kind: _stats(s) for kind, s in samples.items() if s}
        comp: dict[str, Any] = {}
        for name, (a, b) in COMPARED.items():
            pair = _compare(samples[a], samples[b])
            if pair:
                comp[name] = pair["ratio"]
                comp[name.replace("/", "-")] = pair["added"]
                comp[f"{name} rounds"] = pair["rounds"]
        comparisons[row.key] = comp
    return {
        "variants": VARIANTS,
        "rounds": max((len(r) for r in raw.get("rounds", {}).values()), default=0),
        "telemetry": raw.get("telemetry", {}),
        "figures": figures,
        "comparisons": comparisons,
        "targets": _targets(comparisons),
    }


def _noise(rounds: list[float], again: float | None) -> float | None:
    """± on a ratio: half the range of its rounds, or the same variant's two processes' gap."""
    parts = [(max(rounds) - min(rounds)) / 2] if len(rounds) > 1 else []
    if again is not None:
        parts.append(abs(again - 1))
    return max(parts, default=None)


def _verdict(value: float | None, noise: float | None) -> str:
    """What to say next to met / not met."""
    if value is None:
        return "not measured"
    if noise is None:
        return "noise not measured"
    if abs(value - LIMIT) <= noise:
        return f"not conclusive: noise ±{noise:.1%}"
    if noise > LIMIT - 1:
        return f"noise ±{noise:.1%} > {LIMIT - 1:.0%}"
    return ""


def _targets(comparisons: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in ROWS:
        if not row.target:
            continue
        comp = comparisons[row.key]
        value, rounds = comp.get("off/none"), comp.get("off/none rounds", [])
        again = comp.get("again/none")
        noise = _noise(rounds, again)
        out.append(
            {
                "name": row.label.rsplit(" (", 1)[0],
                "key": row.key,
                "goal": f"≤ {LIMIT:.2f}×",
                "value": value,
                "rounds": rounds,
                "again": again,
                "noise": noise,
                "note": _verdict(value, noise),
                "met": value is not None and value <= LIMIT,
            }
        )
    return out


def _fmt(value: float | None, digits: int, unit: str = "") -> str:
    return "–" if value is None else f"{value:,.{digits}f}{unit}"


def _cell(stats: dict[str, Any] | None, digits: int) -> str:
    if not stats:
        return "–"
    text = _fmt(stats["mean"], digits)
    if len(stats["samples"]) > 1:
        text += f" ({_fmt(stats['min'], digits)}–{_fmt(stats['max'], digits)})"
    return text


def markdown(section: dict[str, Any]) -> str:
    """The variants' table, the 5% targets and how to read them."""
    figures, comps = section["figures"], section["comparisons"]
    head = [
        "figure",
        *VARIANTS.values(),
        "tracing on ÷ off",
        "on − off",
        "no exporter ÷ no instrumentation",
        "no instrumentation, 2nd ÷ 1st process",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in ROWS:
        comp = comps[row.key]
        cells = [row.label, *(_cell(figures[row.key].get(k), row.digits) for k in VARIANTS)]
        cells += [
            _fmt(comp.get("on/off"), 3, "×"),
            _fmt(comp.get("on-off"), row.digits + 1),
            _fmt(comp.get("off/none"), 3, "×"),
            _fmt(comp.get("again/none"), 3, "×"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| target (no exporter vs no instrumentation) | goal | measured | per round "
        "| 2nd ÷ 1st process | noise | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in section["targets"]:
        per_round = ", ".join(f"{r:.3f}" for r in t["rounds"]) or "–"
        noise = "–" if t["noise"] is None else f"±{t['noise']:.1%}"
        met = "met" if t["met"] else "**not met**"
        if t["note"]:
            met += f" ({t['note']})"
        cells = [t["name"], t["goal"], _fmt(t["value"], 3, "×"), per_round]
        cells += [_fmt(t["again"], 3, "×"), noise, met]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", _legend(section)]
    return "\n".join(lines)


def _legend(section: dict[str, Any]) -> str:
    rounds = section["rounds"]
    on = section["telemetry"].get(ON, {})
    none = section["telemetry"].get(NONE, {})
    done = []
    if on:
        done.append(
            f"tracing on exported {on.get('otel_spans_exported', 0):,} spans and "
            f"{on.get('otel_metric_exports', 0):,} metric collections (all discarded)"
        )
    if none:
        done.append(f"no instrumentation replaced {none.get('otel_names_removed', 0)} names")
    return (
        "Tracing on: the OpenTelemetry SDK installed by the gateway's own set-up with both "
        "exporters configured, each replaced by one that discards (BatchSpanProcessor; "
        "metrics collected and exported every second) — the SDK's cost without I/O. "
        "No exporter: the default configuration. No instrumentation: the tracer, metric "
        "instruments and RPC span short-circuited. "
        f"Each cell: mean of {rounds} rounds (min–max), the variants' order rotating per "
        "round; RSS: one run. Comparisons: ratio (difference) of the means. Noise: the "
        "larger of half the range of the single rounds' ratios and the gap between two "
        "processes of the same variant (no instrumentation, 2nd ÷ 1st); when the measured "
        "ratio is not farther than that from the limit, this run cannot decide the target."
        + (f" In this run {' and '.join(done)}." if done else "")
    )
