"""`python -m bench.litellm`: the LiteLLM proxy and the gateway on the same paced streams.

Both relay the same loopback provider (`bench.provider`, its own process), one
after the other, in rounds that alternate which goes first: `streams` paced
streams of `deltas` stamped deltas each, `interval_ms` apart, their starts
spread over one interval. The gateway is read over gRPC (its ONESHOT bench
agent), the proxy over its OpenAI-compatible SSE API (`/v1/chat/completions`,
`stream: true`). Each server's CPU is read the same way, from `/proc`, for its
whole process tree, over the window from the first request to the last stream's
end. Three loads, each in every round: *paced* (`streams` streams of `deltas`
deltas `interval_ms` apart, as real models send), *bulk* (the same streams with
no pause: one read carries many deltas) and *calls* (`calls` calls of one delta
each, `streams` at a time: what a call costs besides its tokens). The figures:
CPU per delta (paced, bulk) and per call, and each server's resident memory
(RSS of its process tree) after the rounds; the ratios proxy ÷ gateway against
the ≥ 5× target of each CPU figure (RSS is reported, without a target).

LiteLLM is not a dependency of agw: on first use it is installed (`litellm[proxy]`)
into a virtualenv of its own, `bench/.venv-litellm` (`--venv`), which is ignored by git.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.load import StreamResult, Target, run_stream
from bench.procs import ROOT, Child, spawn, tree_cpu_ns, tree_rss_bytes
from bench.protocol import HOST, MODEL, StreamSpec, parse_stamp
from bench.scenarios import percentile
from service.process import eventloop
from service.testing import free_port

VENV = ROOT / "bench" / ".venv-litellm"
PACKAGE = "litellm[proxy]"
START_TIMEOUT_S = 180.0
TARGET_RATIO = 5.0


def ensure_venv(venv: Path) -> Path:
    """The `litellm` command of `venv`, installing `litellm[proxy]` there first if missing."""
    command = venv / "bin" / "litellm"
    if command.exists():
        return command
    print(f"bench.litellm: installing {PACKAGE} into {venv} (once)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", PACKAGE], check=True)
    return command


@dataclass
class Proxy:
    """A running LiteLLM proxy in front of the bench provider."""

    process: asyncio.subprocess.Process
    port: int
    key: str
    directory: tempfile.TemporaryDirectory[str]

    @classmethod
    async def start(cls, command: Path, provider_url: str) -> Proxy:
        directory = tempfile.TemporaryDirectory(prefix="agw-litellm-")
        config = Path(directory.name) / "config.yaml"
        config.write_text(
            "model_list:\n"
            f"  - model_name: {MODEL}\n"
            "    litellm_params:\n"
            f"      model: openai/{MODEL}\n"
            f"      api_base: {provider_url}\n"
            "      api_key: sk-bench\n"
            "litellm_settings:\n"
            "  telemetry: false\n"
        )
        key = "sk-" + secrets.token_hex(24)
        env = {
            **os.environ,
            "LITELLM_MASTER_KEY": key,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no download of the price table
            "LITELLM_LOG": "ERROR",
        }
        port = free_port()
        process = await asyncio.create_subprocess_exec(
            str(command),
            *("--config", str(config), "--host", HOST, "--port", str(port), "--num_workers", "1"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=(Path(directory.name) / "proxy.log").open("wb"),
            env=env,
            start_new_session=True,
        )
        proxy = cls(process, port, key, directory)
        await proxy._wait_ready()
        return proxy

    @property
    def log_tail(self) -> str:
        return (Path(self.directory.name) / "proxy.log").read_text(errors="replace")[-3000:]

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        url = f"http://{HOST}:{self.port}/health/liveliness"
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.process.returncode is not None:
                    raise RuntimeError(f"the LiteLLM proxy exited on start:\n{self.log_tail}")
                try:
                    async with session.get(url) as response:
                        if response.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.5)
        raise RuntimeError(f"the LiteLLM proxy was not ready in {START_TIMEOUT_S:g}s")

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 20)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        self.directory.cleanup()


async def proxy_stream(
    session: aiohttp.ClientSession, proxy: Proxy, spec: StreamSpec
) -> StreamResult:
    """Read one streamed chat completion from the proxy, stamping each delta's arrival."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": spec.to_message()}]}
    result = StreamResult(time.monotonic_ns())
    url = f"http://{HOST}:{proxy.port}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {proxy.key}"}
    try:
        async with session.post(url, json={**body, "stream": True}, headers=headers) as response:
            if response.status != 200:
                result.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                return result
            async for line in response.content:
                now = time.monotonic_ns()
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                if not result.first_event_ns:
                    result.first_event_ns = now
                choices = json.loads(line[6:]).get("choices") or []
                text = choices[0].get("delta", {}).get("content") if choices else None
                if text:
                    result.arrivals.append((now, text))
    except aiohttp.ClientError as error:
        result.error = f"{type(error).__name__}: {error}"
    return result


@dataclass
class Window:
    """One server's figures over one round."""

    cpu_ns: int
    deltas: int
    expected: int
    calls: int = 0
    latencies_ns: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def measure(pid: int, specs: list[StreamSpec], read: Callable[[StreamSpec], Any]) -> Window:
    """Run the streams at once against one server; its CPU and what it delivered."""
    before = tree_cpu_ns(pid)
    results: list[StreamResult] = await asyncio.gather(*(read(spec) for spec in specs))
    cpu = tree_cpu_ns(pid) - before
    window = Window(cpu, sum(r.deltas for r in results), sum(s.deltas for s in specs), len(specs))
    for r in results:
        window.latencies_ns += [arrival - parse_stamp(text)[0] for arrival, text in r.arrivals]
        if r.error:
            window.errors.append(r.error)
    return window


LOADS = ("paced", "bulk", "calls")


def specs_of(args: argparse.Namespace, load: str = "paced") -> list[StreamSpec]:
    if load == "bulk":
        return [StreamSpec(args.deltas) for _ in range(args.streams)]
    if load == "calls":
        return [StreamSpec(1) for _ in range(args.calls)]
    return [
        StreamSpec(args.deltas, args.interval_ms, phase_ms=args.interval_ms * n / args.streams)
        for n in range(args.streams)
    ]


async def measure_load(
    pid: int, specs: list[StreamSpec], read: Callable[[StreamSpec], Any], at_once: int
) -> Window:
    """`measure`, `at_once` streams at a time (the calls load), as one window."""
    if len(specs) <= at_once:
        return await measure(pid, specs, read)
    windows = [
        await measure(pid, specs[n : n + at_once], read) for n in range(0, len(specs), at_once)
    ]
    total = Window(0, 0, 0)
    for window in windows:
        total.cpu_ns += window.cpu_ns
        total.deltas += window.deltas
        total.expected += window.expected
        total.calls += window.calls
        total.latencies_ns += window.latencies_ns
        total.errors += window.errors
    return total


async def run(args: argparse.Namespace) -> dict[str, Any]:
    command = ensure_venv(args.venv)
    provider: Child = await spawn("provider")
    gateway: Child | None = None
    proxy: Proxy | None = None
    target: Target | None = None
    try:
        url = f"http://{HOST}:{provider.port}/v1"
        gateway, proxy = await asyncio.gather(
            spawn("gateway", "--provider-url", url, "--max-streams", str(args.streams + 100)),
            Proxy.start(command, url),
        )
        target = Target("gateway", gateway.port)
        await target.ready()
        reads = {
            "gateway": (gateway.pid, lambda s: run_stream(target, s)),
            "litellm": (proxy.process.pid, lambda s: proxy_stream(session, proxy, s)),
        }
        windows: dict[str, dict[str, list[Window]]] = {
            kind: {load: [] for load in LOADS} for kind in reads
        }
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        ) as session:
            warm = [StreamSpec(5)] * 4  # first calls pay for imports and connections
            for pid, read in reads.values():
                await measure(pid, warm, read)  # type: ignore[arg-type]
            for number in range(args.rounds):
                order = ["gateway", "litellm"] if number % 2 == 0 else ["litellm", "gateway"]
                for load in LOADS:
                    for kind in order:
                        print(f"bench.litellm: round {number + 1} {load} {kind}", file=sys.stderr)
                        pid, read = reads[kind]
                        windows[kind][load].append(
                            await measure_load(pid, specs_of(args, load), read, args.streams)  # type: ignore[arg-type]
                        )
            rss = {kind: tree_rss_bytes(pid) for kind, (pid, _) in reads.items()}
        return summarize(args, windows, rss)
    finally:
        if target is not None:
            await target.close()
        for child in (gateway, provider):
            if child is not None:
                await child.stop()
        if proxy is not None:
            await proxy.stop()


def summarize(
    args: argparse.Namespace, windows: dict[str, dict[str, list[Window]]], rss: dict[str, int]
) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "streams": args.streams,
        "deltas": args.deltas,
        "interval_ms": args.interval_ms,
        "calls": args.calls,
        "rounds": args.rounds,
        "load_average": os.getloadavg()[0],
        "target_ratio": TARGET_RATIO,
    }
    for kind, loads in windows.items():
        figures[kind] = {"rss_mib": rss.get(kind, 0) / (1 << 20)}
        for load, measured in loads.items():
            deltas = sum(w.deltas for w in measured)
            calls = sum(w.calls for w in measured)
            latencies = [x for w in measured for x in w.latencies_ns]
            cpu_ns = sum(w.cpu_ns for w in measured)
            figures[kind][load] = {
                "cpu_per_delta_us": cpu_ns / max(deltas, 1) / 1e3,
                "cpu_per_call_us": cpu_ns / max(calls, 1) / 1e3,
                "delivered": deltas,
                "expected": sum(w.expected for w in measured),
                "latency_p50_us": percentile(latencies, 50) / 1e3,
                "latency_p99_us": percentile(latencies, 99) / 1e3,
                "errors": [e for w in measured for e in w.errors][:5],
            }
    g, lite = figures["gateway"], figures["litellm"]

    def ratio(a: float, b: float) -> float:
        return a / b if b else 0.0

    figures["ratios"] = {
        "paced_per_delta": ratio(lite["paced"]["cpu_per_delta_us"], g["paced"]["cpu_per_delta_us"]),
        "bulk_per_delta": ratio(lite["bulk"]["cpu_per_delta_us"], g["bulk"]["cpu_per_delta_us"]),
        "per_call": ratio(lite["calls"]["cpu_per_call_us"], g["calls"]["cpu_per_call_us"]),
        "rss": ratio(lite["rss_mib"], g["rss_mib"]),
    }
    figures["ratio"] = figures["ratios"]["paced_per_delta"]
    return figures


def markdown(figures: dict[str, Any]) -> str:
    g, lite, ratios = figures["gateway"], figures["litellm"], figures["ratios"]
    target = figures["target_ratio"]

    def verdict(value: float) -> str:
        return f"{value:.2f}× (target ≥ {target:g}×: {'met' if value >= target else 'NOT met'})"

    def cpu_row(label: str, load: str, key: str, ratio_key: str) -> str:
        return (
            f"| {label} | {g[load][key]:.1f} µs | {lite[load][key]:.1f} µs | "
            f"{verdict(ratios[ratio_key])} |"
        )

    return "\n".join(
        [
            f"LiteLLM proxy vs gateway: paced {figures['streams']} streams × "
            f"{figures['deltas']} deltas, {figures['interval_ms']:g} ms apart; bulk the same "
            f"without pauses; {figures['calls']} calls of 1 delta, {figures['streams']} at a "
            f"time; {figures['rounds']} rounds; load average {figures['load_average']:.2f}",
            "",
            "| figure | gateway (gRPC) | LiteLLM proxy (SSE) | proxy ÷ gateway |",
            "|---|---|---|---|",
            cpu_row("CPU per paced delta", "paced", "cpu_per_delta_us", "paced_per_delta"),
            cpu_row("CPU per bulk delta", "bulk", "cpu_per_delta_us", "bulk_per_delta"),
            cpu_row("CPU per call (1 delta)", "calls", "cpu_per_call_us", "per_call"),
            f"| RSS after the rounds | {g['rss_mib']:.0f} MiB | {lite['rss_mib']:.0f} MiB | "
            f"{ratios['rss']:.2f}× (no target) |",
            f"| paced delta latency p50 / p99 | {g['paced']['latency_p50_us']:.0f} / "
            f"{g['paced']['latency_p99_us']:.0f} µs | {lite['paced']['latency_p50_us']:.0f} / "
            f"{lite['paced']['latency_p99_us']:.0f} µs | |",
            "| deltas delivered (paced, bulk, calls) | "
            + ", ".join(f"{g[x]['delivered']}/{g[x]['expected']}" for x in LOADS)
            + " | "
            + ", ".join(f"{lite[x]['delivered']}/{lite[x]['expected']}" for x in LOADS)
            + " | |",
        ]
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.litellm", description=__doc__)
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--deltas", type=int, default=250)
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--calls", type=int, default=200, help="calls of one delta")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--venv", type=Path, default=VENV)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "litellm.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    figures = eventloop.run(run(args), os.environ.get("AGW_EVENT_LOOP", "auto"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(markdown(figures))


if __name__ == "__main__":
    main()
