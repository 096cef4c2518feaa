"""The report: the gateway's figures next to the baselines, the ratios, the targets.

`build` turns the raw figures of a run into the results document (also written
as JSON); `markdown` renders it as the tables docs/performance.md quotes. The targets
are judged on the gateway against the minimal relay on the HTTP client the
gateway uses itself (aiohttp, `REFERENCE`) measured in the same run, and the
paced load's figures are those of a rate both sustained (bench/suite.py). The
gateway's variants with and without instrumentation follow in their own section.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench import overhead
from bench.protocol import PACED_AT_COMMON_RATE, RAMPED, REFERENCE
from bench.scenarios import SUSTAINED

RELAY = REFERENCE
Servers = dict[str, dict[str, Any]]
_NAMES = {
    "bare": "bare gRPC",
    "relay": "relay (httpx)",
    "relay-aiohttp": "relay (aiohttp)",
    "relay-contract": "relay (aiohttp, contract events)",
    "gateway": "gateway",
}
Comparisons = dict[str, dict[str, float]]


@dataclass(frozen=True)
class Figure:
    """A measured number, per server; `compare` is how the gateway is set against the relay.

    `only`: the servers it is measured on, when not all of them.
    """

    key: str
    label: str
    compare: str  # "ratio" (gateway ÷ relay) or "added" (gateway − relay)
    digits: int = 1
    only: tuple[str, ...] | None = None


FIGURES: tuple[Figure, ...] = (
    Figure("cpu_us_per_delta_load", "CPU per delta, paced load (µs)", "ratio"),
    Figure("cpu_us_per_delta_light", "CPU per delta, light paced (µs)", "ratio"),
    Figure("cpu_us_per_delta_bulk", "CPU per delta, bulk (µs)", "ratio"),
    Figure("cpu_us_per_call", "CPU per 1-delta call (µs)", "ratio"),
    Figure("ttfe_p50_ms", "time to first delta p50 (ms)", "added", 2),
    Figure("ttfe_p99_ms", "time to first delta p99 (ms)", "added", 2),
    Figure("ttfe_slow_p50_ms", "time to first delta p50, provider TTFT 20 ms (ms)", "added", 2),
    Figure("latency_p50_us", "per-delta latency p50 (µs)", "added", 0),
    Figure("latency_p99_us", "per-delta latency p99 (µs)", "added", 0),
    Figure("rss_kib_per_stream", "RSS per open stream (KiB)", "added"),
    Figure("capacity_per_s", "highest sustained paced rate (deltas/s)", "ratio", 0, RAMPED),
    Figure("load_rate_per_s", "paced load: delivered deltas/s", "ratio", 0),
    Figure("load_latency_p50_ms", "paced load: latency p50 (ms)", "added", 2),
    Figure("load_latency_p99_ms", "paced load: latency p99 (ms)", "added", 2),
    Figure("load_server_cores", "paced load: server CPU (cores)", "ratio", 2),
)
ERROR_KEYS = ("idle_errors", "ttfe_errors", "latency_errors", "bulk_errors", "load_errors")


def _get(servers: Servers, kind: str, key: str) -> float | None:
    value = servers.get(kind, {}).get(key)
    return float(value) if isinstance(value, int | float) else None


def comparisons(servers: Servers) -> Comparisons:
    """For each figure: gateway ÷ relay or gateway − relay (each relay, and bare), and the
    httpx relay and the contract relay each ÷ the aiohttp relay."""
    out: dict[str, dict[str, float]] = {}
    for fig in FIGURES:
        row: dict[str, float] = {}
        for base in (RELAY, "relay", "relay-contract", "bare"):
            g, b = _get(servers, "gateway", fig.key), _get(servers, base, fig.key)
            if g is None or b is None:
                continue
            if fig.compare == "ratio":
                if b > 0:
                    row[f"gateway/{base}"] = g / b
            else:
                row[f"gateway-{base}"] = g - b
        h, a = _get(servers, "relay", fig.key), _get(servers, RELAY, fig.key)
        c = _get(servers, "relay-contract", fig.key)
        if fig.compare == "ratio" and h is not None and a:
            row["httpx/aiohttp"] = h / a
        if fig.compare == "ratio" and c is not None and a:
            row["contract/aiohttp"] = c / a
        out[fig.key] = row
    return out


@dataclass(frozen=True)
class Target:
    """A goal of the issue: `measure(...) <= limit`, and `condition`'s check when there is one."""

    name: str
    goal: str
    measure: Callable[[Servers, Comparisons], float | None]
    limit: float
    unit: str
    condition: Callable[[Servers], str] | None = None  # "" when fine, else what failed


def _cmp(key: str, how: str) -> Callable[[Servers, Comparisons], float | None]:
    return lambda servers, comp: comp.get(key, {}).get(how)


def _gateway(key: str) -> Callable[[Servers, Comparisons], float | None]:
    return lambda servers, comp: _get(servers, "gateway", key)


def _sustained(servers: Servers) -> str:
    return "" if servers.get("gateway", {}).get("load_sustained") else "not sustained"


def _both_sustained(servers: Servers) -> str:
    """ "" when the paced load was sustained by every server it compares, else which not."""
    missing = [k for k in PACED_AT_COMMON_RATE if not servers.get(k, {}).get("load_sustained")]
    return f"not sustained by {', '.join(_NAMES.get(k, k) for k in missing)}" if missing else ""


_VS = f"{RELAY}"  # the key suffix of comparisons with the reference relay

TARGETS: tuple[Target, ...] = (
    Target(
        "CPU per delta, paced load (sustained)",
        "≤ 1.15× relay",
        _cmp("cpu_us_per_delta_load", f"gateway/{_VS}"),
        1.15,
        "×",
        _both_sustained,
    ),
    Target(
        "CPU per 1-delta call (a run's fixed cost)",
        "≤ 2× relay",
        _cmp("cpu_us_per_call", f"gateway/{_VS}"),
        2.0,
        "×",
    ),
    Target(
        "added time to first delta p50",
        "≤ 1 ms",
        _cmp("ttfe_p50_ms", f"gateway-{_VS}"),
        1.0,
        "ms",
    ),
    Target(
        "added time to first delta p50, provider TTFT 20 ms",
        "≤ 0.3 ms",
        _cmp("ttfe_slow_p50_ms", f"gateway-{_VS}"),
        0.3,
        "ms",
    ),
    Target(
        "CPU per delta, bulk",
        "≤ 2× relay",
        _cmp("cpu_us_per_delta_bulk", f"gateway/{_VS}"),
        2.0,
        "×",
    ),
    Target(
        "added per-delta latency p50",
        "≤ 150 µs",
        _cmp("latency_p50_us", f"gateway-{_VS}"),
        150.0,
        "µs",
    ),
    Target(
        "added per-delta latency p99",
        "≤ 1000 µs",
        _cmp("latency_p99_us", f"gateway-{_VS}"),
        1000.0,
        "µs",
    ),
    Target("RSS per open stream", "≤ 50 KiB", _gateway("rss_kib_per_stream"), 50.0, "KiB"),
    Target(
        "paced load sustained, latency p99",
        "sustained, p99 ≤ 20 ms",
        _gateway("load_latency_p99_ms"),
        20.0,
        "ms",
        _sustained,
    ),
)


def targets(servers: Servers, comp: Comparisons) -> list[dict[str, Any]]:
    out = []
    for t in TARGETS:
        value = t.measure(servers, comp)
        note = t.condition(servers) if t.condition is not None else ""
        met = value is not None and value <= t.limit and not note
        out.append(
            {
                "name": t.name,
                "goal": t.goal,
                "value": value,
                "unit": t.unit,
                "note": note,
                "met": met,
            }
        )
    return out


def build(raw: dict[str, Any]) -> dict[str, Any]:
    """The results document: run context, figures per server, comparisons, targets.

    `tracing` compares the gateway's variants (bench/overhead.py).
    """
    servers: dict[str, dict[str, Any]] = raw["servers"]
    comp = comparisons(servers)
    return {
        **raw,
        "comparisons": comp,
        "targets": targets(servers, comp),
        "tracing": overhead.build(raw),
    }


def _fmt(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def markdown(results: dict[str, Any]) -> str:
    """The figures table, the targets table and the run's context, in Markdown."""
    servers: Servers = results["servers"]
    comp: Comparisons = results["comparisons"]
    kinds = [k for k in _NAMES if k in servers]
    relay = _NAMES[RELAY]
    head = ["figure", *(_NAMES[k] for k in kinds), f"gateway ÷ {relay}", f"gateway − {relay}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for fig in FIGURES:
        cells = [fig.label, *(_fmt(_get(servers, k, fig.key), fig.digits) for k in kinds)]
        row = comp.get(fig.key, {})
        ratio = row.get(f"gateway/{RELAY}") if fig.compare == "ratio" else None
        added = row.get(f"gateway-{RELAY}") if fig.compare == "added" else None
        cells += [_fmt(ratio, 2) + ("×" if ratio is not None else ""), _fmt(added, fig.digits)]
        lines.append("| " + " | ".join(cells) + " |")
    sustained = [
        ("yes" if servers[k].get("load_sustained") else "**no**") if k in servers else "–"
        for k in kinds
    ]
    lines.append("| paced load: sustained | " + " | ".join(sustained) + " | | |")
    lines += [
        "",
        f"| target (gateway vs {relay}) | goal | measured | met |",
        "|---|---|---|---|",
    ]
    for t in results["targets"]:
        value = _fmt(t["value"], 2)
        measured = f"{value} {t['unit']}" if t["value"] is not None else value
        if t["note"]:
            measured += f", {t['note']}"
        met = "met" if t["met"] else "**not met**"
        lines.append(f"| {t['name']} | {t['goal']} | {measured} | {met} |")
    lines += ["", _context(results)]
    if any(kind in servers for kind in overhead.VARIANTS if kind != "gateway"):
        lines += ["", "### Tracing on vs off", "", overhead.markdown(results["tracing"])]
    return "\n".join(lines)


def _context(results: dict[str, Any]) -> str:
    meta, sizes = results["meta"], results["meta"]["sizes"]
    servers: Servers = results["servers"]
    comp: Comparisons = results["comparisons"]
    streams = meta.get("load_streams", sizes["load_streams"])
    offered = streams * 1000 / sizes["load_interval_ms"]
    step = sizes["ramp_step"] * 1000 / sizes["load_interval_ms"]
    ramp_low = sizes["ramp_streams"] * 1000 / sizes["load_interval_ms"]
    ramp_high = sizes["ramp_max_streams"] * 1000 / sizes["load_interval_ms"]
    common = " and ".join(_NAMES.get(k, k) for k in PACED_AT_COMMON_RATE)
    parts = [
        f"Measured {meta['started_at']} on {meta['cpus']} CPUs (load average "
        f"{meta['loadavg_before'][0]:.2f} before, {meta['loadavg_after'][0]:.2f} after), "
        f"Python {meta['python']}, event loop {meta.get('event_loop', 'asyncio')}, "
        f"in {meta['duration_s']} s"
        + (" — quick sizes, not representative." if meta["quick"] else "."),
        f"Highest sustained paced rate: steps of {ramp_low:,.0f}, +{step:,.0f}, … up to "
        f"{ramp_high:,.0f} deltas/s offered ({sizes['ramp_deltas']} deltas per stream, "
        f"{sizes['load_interval_ms']:g} ms apart), to the first step not sustained (twice); "
        f"sustained = every delta delivered, each stream from its first delta to its last "
        f"at ≥ {SUSTAINED:.0%} of its pace (summed over the streams). Paced load: "
        f"{streams} streams × {sizes['load_deltas']} deltas, "
        f"{sizes['load_interval_ms']:g} ms apart ({offered:,.0f} deltas/s offered: one step "
        f"below the highest step both the {common} sustained, at most {sizes['load_streams']} "
        f"streams"
        + (
            f"; run again lower, as {meta['load_first_streams']} streams were not sustained"
            if meta.get("load_first_streams", streams) != streams
            else ""
        )
        + "). Paced "
        f"streams start spread over {sizes['stagger_ms']:g} ms. Light paced: "
        f"{sizes['latency_streams']} × {sizes['latency_deltas']} deltas "
        f"{sizes['latency_interval_ms']:g} ms apart. Bulk: {sizes['bulk_streams']} × "
        f"{sizes['bulk_deltas']} deltas at once. Idle: {sizes['idle_streams']} open streams. "
        f"Time to first delta: {sizes['ttfe_calls']} calls one at a time.",
    ]
    http = comp.get("cpu_us_per_delta_load", {}).get("httpx/aiohttp")
    if http is not None:
        light = comp.get("cpu_us_per_delta_light", {}).get("httpx/aiohttp", 0.0)
        bulk = comp.get("cpu_us_per_delta_bulk", {}).get("httpx/aiohttp", 0.0)
        parts.append(
            f"HTTP client: relay CPU per delta httpx ÷ aiohttp = {http:.2f}× (paced load), "
            f"{light:.2f}× (light paced), {bulk:.2f}× (bulk)."
        )
    floor = comp.get("cpu_us_per_call", {}).get("contract/aiohttp")
    if floor is not None:
        beyond = comp["cpu_us_per_call"].get("gateway/relay-contract")
        parts.append(
            f"CPU per 1-delta call, floor set by the contract's 7 events per 1-delta run: "
            f"relay-contract ÷ relay = {floor:.2f}×"
            + (f" (gateway ÷ relay-contract = {beyond:.2f}×)." if beyond is not None else ".")
        )
    loads = ", ".join(
        f"{_NAMES.get(k, k)} {v.get('load_provider_cores', 0):.2f} / "
        f"{v.get('load_client_cores', 0):.2f}"
        for k, v in servers.items()
    )
    parts.append(f"Provider / load-client CPU (cores) during the paced load: {loads}.")
    errors = {k: sum(int(v.get(e, 0)) for e in ERROR_KEYS) for k, v in servers.items()}
    if any(errors.values()):
        parts.append(f"**Failed streams**: {errors}.")
    return "\n".join(parts)
