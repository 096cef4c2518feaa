"""`python -m bench.workers`: the sustained paced deltas/s of the service as 1 worker and as 2.

Both run `python -m service` as deployed, on the same shared state (the Redis run bus,
PostgreSQL chats and run logs: what `AGW_WORKERS` > 1 requires, so the single process
runs on it too and only the number of processes differs), against the benchmark's
fake provider (`python -m bench.serve provider`, its own process). PostgreSQL and Redis
are throwaway servers on loopback (`service.testing.servers`).

For each, a capacity ramp (`bench.scenarios._paced`: streams of 50 deltas/s, their starts
spread over a second) raises the number of streams step by step up to the first step not
sustained twice in a row (every delta delivered, each stream at ≥ 95% of its pace); the
figure is the highest sustained rate, and the target is 2 workers ≥ 1.7× one. Each step
also records where the CPU went — the service's processes (supervisor and workers), the
provider, the load client (this process), redis-server, PostgreSQL — and the machine's
busy cores over the step from /proc/stat (which includes everyone else's work).

    python -m bench.workers [--quick] [--ramp-streams 40] [--ramp-step 20]
                            [--ramp-max-streams 600] [--ramp-deltas 100] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.load import Target, run_stream
from bench.options import Sizes
from bench.procs import ROOT, Child, spawn
from bench.protocol import AGENT_KEY, HOST, MODEL, StreamSpec
from bench.scenarios import _paced
from service.process import eventloop
from service.testing import PostgresServer, RedisServer, oneshot_agent, write_agent

TARGET_RATIO = 1.7
# At equal load per worker, 2 workers' service CPU per delta over 1 worker's: what linear
# scaling needs for the throughput target on a box with a core per worker (2 ÷ 1.7).
TARGET_EQUAL_LOAD = 2 / TARGET_RATIO
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "workers.json"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
START_TIMEOUT_S = 90.0


def tree_cpu_ns(pid: int) -> int:
    """CPU time (user + system) of process `pid` and all its live descendants, in ns."""
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        with contextlib.suppress(OSError):
            with open(f"/proc/{current}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as f:
                    stack += [int(child) for child in f.read().split()]
    return total * 1_000_000_000 // CLOCK_TICKS


def machine_busy_ns() -> tuple[int, int]:
    """The machine's busy and total CPU time so far, over all cores (from /proc/stat), ns."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    scale = 1_000_000_000 // CLOCK_TICKS
    return (sum(values) - idle) * scale, sum(values) * scale


@dataclass
class ServiceTree:
    """`python -m service` (a supervisor and its workers, or one process), measured as a
    whole: it quacks like a `bench.procs.Child` for `bench.scenarios`."""

    kind: str
    process: asyncio.subprocess.Process
    port: int

    async def stats(self) -> dict[str, Any]:
        return {"cpu_ns": tree_cpu_ns(self.process.pid)}


def service_env(
    workers: int, provider_url: str, workdir: Path, dsn: str, redis_url: str, streams: int
) -> dict[str, str]:
    """Production defaults, except as listed (as `bench.gateway.gateway_settings`), on the
    shared state; logs at WARNING (a line per run is not what is measured)."""
    agents = workdir / "agents"
    write_agent(agents, AGENT_KEY, oneshot_agent("You are a benchmark."))
    (workdir / "tools").mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "gen"))),
        "AGW_WORKERS": str(workers),
        "AGW_GRPC_ADDRESS": f"{HOST}:0",
        "AGW_HTTP_ENABLED": "false",
        "AGW_AGENTS_DIR": str(agents),
        "AGW_AGENTS_WATCH": "false",
        "AGW_TOOLS_DIR": str(workdir / "tools"),
        "AGW_BASH_WORKING_DIR": str(workdir / "workspace"),
        "AGW_DATA_DIR": str(workdir / "data"),
        "AGW_DISCONNECT_POLICY": "cancel",
        "AGW_MAX_CONCURRENT_RUNS": str(streams),
        "AGW_SHUTDOWN_GRACE_S": "2",
        "AGW_CHAT_STORE": "postgres",
        "AGW_RUN_LOG": "postgres",
        "AGW_POSTGRES_DSN": dsn,
        "AGW_RUN_BUS": "redis",
        "AGW_REDIS_URL": redis_url,
        "AGW_DEFAULT_PROVIDER": "bench",
        "AGW_PROVIDERS__BENCH__BASE_URL": provider_url,
        "AGW_PROVIDERS__BENCH__DEFAULT_MODEL": MODEL,
        "AGW_PROVIDERS__BENCH__MAX_RETRIES": "0",
        "AGW_PROVIDERS__BENCH__MAX_CONNECTIONS": str(streams),
        "AGW_LOG_LEVEL": "WARNING",
        "AGW_MCP_SERVERS": "[]",  # not the example MCP server `make run` starts
    }
    env.pop("AGW_CONFIG_FILE", None)
    return env


@contextlib.asynccontextmanager
async def running_service(
    workers: int, env: dict[str, str], workdir: Path
) -> AsyncIterator[ServiceTree]:
    """`python -m service` with `workers`, until every worker listens; stopped on exit."""
    port_file = workdir / "port"
    log_file = workdir / "service.log"
    with log_file.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "service",
            "--port-file",
            str(port_file),
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=log,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (port_file.exists() and port_file.read_text()):
            if process.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"bench: {workers} worker(s) did not start:\n{log_file.read_text()}"
                )
            await asyncio.sleep(0.05)
        yield ServiceTree(
            f"{workers} worker{'s' if workers > 1 else ''}", process, int(port_file.read_text())
        )
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()


def tcp_connections(port: int) -> list[tuple[int, int, str]]:
    """(local port, remote port, inode) of every established TCP connection from or to `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                local, remote = (int(a.rsplit(":", 1)[1], 16) for a in fields[1:3])
                if fields[3] == "01" and port in (local, remote):
                    found.append((local, remote, fields[9]))
    return found


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process `pid` holds."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def service_pids(pid: int) -> list[int]:
    """The processes serving: the workers under a supervisor, else the process itself."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        children = [int(child) for child in f.read().split()]
    return children or [pid]


async def balanced_target(service: ServiceTree, per_worker: int) -> Target:
    """A load target with `per_worker` connections on each worker of the service.

    The kernel spreads connections over the workers by a hash, unevenly for a few
    long-lived ones (many clients even it out); the load client opens connections until
    each worker has its share (which worker holds a connection is read from /proc) and
    closes the rest, so that both worker counts are offered the same load per worker.
    """
    pids = service_pids(service.process.pid)
    tries = per_worker * len(pids) * 8
    target = Target(service.kind, service.port, tries)
    held: dict[int, list[int]] = {pid: [] for pid in pids}
    seen: set[int] = set()
    mine = str(os.getpid())
    for index, channel in enumerate(target._channels):
        await channel.channel_ready()
        ours = socket_inodes(int(mine))
        connections = tcp_connections(service.port)
        new = [loc for loc, rem, inode in connections if rem == service.port and inode in ours]
        fresh = [p for p in new if p not in seen]
        seen.update(fresh)
        if len(fresh) != 1:
            continue
        server_side = {inode for loc, rem, inode in connections if rem == fresh[0]}
        for pid in pids:
            if server_side & socket_inodes(pid) and len(held[pid]) < per_worker:
                held[pid].append(index)
        if all(len(indexes) == per_worker for indexes in held.values()):
            break
    else:
        raise RuntimeError(f"bench: no {per_worker} connections on each of {pids}: {held}")
    keep = sorted(i for indexes in held.values() for i in indexes)
    for index, channel in enumerate(target._channels):
        if index not in keep:
            await channel.close()
    target._channels = [target._channels[i] for i in keep]
    target._stubs = [target._stubs[i] for i in keep]
    return target


class CpuMeter:
    """CPU of the state servers and of the whole machine around a measured step."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._start: dict[str, int] = {}

    def _snapshot(self) -> dict[str, int]:
        busy, total = machine_busy_ns()
        cpu = {name: tree_cpu_ns(pid) for name, pid in self.pids.items()}
        return {**cpu, "machine_busy": busy, "machine_total": total, "wall": time.monotonic_ns()}

    def start(self) -> None:
        self._start = self._snapshot()

    def stop(self) -> dict[str, float]:
        """Cores used by each over the step; `machine` is the busy cores of the whole box."""
        end = self._snapshot()
        delta = {k: end[k] - self._start[k] for k in end}
        wall = delta.pop("wall") or 1
        cores = {f"{name}_cores": delta[name] / wall for name in self.pids}
        cores["machine_cores"] = delta["machine_busy"] / wall
        return cores


async def ramp(
    service: ServiceTree, provider: Child, target: Target, sizes: Sizes, meter: CpuMeter
) -> dict[str, Any]:
    """The capacity ramp of `bench.scenarios.capacity`, with the CPU of every process."""
    steps: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    server: Any = service
    for streams in range(sizes.ramp_streams, sizes.ramp_max_streams + 1, max(1, sizes.ramp_step)):
        for _attempt in range(2):  # a hiccup of the shared machine gets a second chance
            meter.start()
            step = await _paced(server, provider, target, streams, sizes.ramp_deltas, sizes)
            cores = meter.stop()
            if step["load_sustained"]:
                break
        figures = {
            "streams": streams,
            "offered_per_s": step["load_offered_per_s"],
            "rate_per_s": step["load_rate_per_s"],
            "pace": step["load_pace"],
            "sustained": step["load_sustained"],
            "errors": step["load_errors"],
            "cpu_us_per_delta": step["cpu_us_per_delta_load"],
            "latency_p99_ms": step["load_latency_p99_ms"],
            "service_cores": step["load_server_cores"],
            "provider_cores": step["load_provider_cores"],
            "client_cores": step["load_client_cores"],
            **cores,
        }
        figures["others_cores"] = max(0.0, figures["machine_cores"] - sum(figures[k] for k in OURS))
        steps.append(figures)
        verdict = "sustained" if figures["sustained"] else "NOT sustained"
        _progress(
            f"{service.kind}: {streams} streams {verdict} ({figures['rate_per_s']:.0f} deltas/s,"
            f" machine {figures['machine_cores']:.2f} cores)"
        )
        if not figures["sustained"]:
            break
        best = figures
    return {
        "capacity_streams": best["streams"] if best else 0,
        "capacity_per_s": best["streams"] * 1000 / sizes.load_interval_ms if best else 0.0,
        "at_capacity": best,
        "first_unsustained": steps[-1] if steps and not steps[-1]["sustained"] else None,
        "steps": steps,
    }


async def warm_up(target: Target, streams: int) -> None:
    """Connections, pools, lazy imports and the database's first rows, on every worker."""
    await target.ready()
    results = await asyncio.gather(*(run_stream(target, StreamSpec(20)) for _ in range(streams)))
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"bench: warm-up failed: {errors[0]}")


async def measure(
    sizes: Sizes, counts: tuple[int, ...] = (1, 2), rounds_: int = 2
) -> dict[str, Any]:
    """Ramp each worker count `rounds_` times, alternating; the figures and the ratio.

    Both services run side by side from the start (each its own database, one Redis),
    idle while the other is measured; the rounds alternate the order (1 then 2, 2 then
    1, ...) so that a slow drift of the shared machine weighs on both alike. Each count's
    figure is its best round: the one least disturbed by others' work on the machine.
    """
    started = time.time()
    meta: dict[str, Any] = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "cpus": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
        "sizes": {
            k: getattr(sizes, k)
            for k in (
                "ramp_streams",
                "ramp_step",
                "ramp_max_streams",
                "ramp_deltas",
                "load_interval_ms",
                "stagger_ms",
            )
        },
        "event_loop": eventloop.loop_name(os.environ.get("AGW_EVENT_LOOP", "auto")),
    }
    rounds: dict[str, list[dict[str, Any]]] = {str(count): [] for count in counts}
    max_streams = sizes.ramp_max_streams + 100
    with (
        PostgresServer.start() as postgres,
        RedisServer.start() as redis,
        _workdir() as root,
    ):
        assert postgres.process is not None and redis.process is not None
        meter = CpuMeter({"redis": redis.process.pid, "postgres": postgres.process.pid})
        async with contextlib.AsyncExitStack() as stack:
            provider = await spawn("provider")
            stack.push_async_callback(provider.stop)
            url = f"http://{HOST}:{provider.port}/v1"
            services: dict[int, tuple[ServiceTree, Target]] = {}
            for count in counts:
                dsn = postgres.create_database(f"bench_workers_{count}")
                workdir = root / f"w{count}"
                env = service_env(count, url, workdir, dsn, redis.url, max_streams)
                service = await stack.enter_async_context(running_service(count, env, workdir))
                target = await balanced_target(service, sizes.channels)
                stack.push_async_callback(target.close)
                await warm_up(target, 20 * count)
                services[count] = (service, target)
            for number in range(rounds_):
                order = counts if number % 2 == 0 else counts[::-1]  # 1 2, 2 1, 1 2: drift cancels
                for count in order:
                    service, target = services[count]
                    run = await ramp(service, provider, target, sizes, meter)
                    rounds[str(count)].append(run)
    meta["loadavg_after"] = os.getloadavg()
    meta["duration_s"] = round(time.time() - started, 1)
    runs = {
        count: {
            **max(done, key=lambda run: run["capacity_per_s"]),
            "rounds_per_s": [run["capacity_per_s"] for run in done],
        }
        for count, done in rounds.items()
    }
    one, two = (runs.get(str(c), {}).get("capacity_per_s", 0.0) for c in (1, 2))
    ratio = two / one if one else 0.0
    return {
        "meta": meta,
        "workers": runs,
        "rounds": rounds,
        "ratio": ratio,
        "target": TARGET_RATIO,
        "met": ratio >= TARGET_RATIO,
        "ceiling": ceiling(runs.get("1", {}), os.cpu_count() or 1),
        "equal_load": equal_load(rounds),
    }


def equal_load(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The service's CPU per delta at the same load per worker: 1 worker at `streams`
    streams against 2 workers at twice as many (each of them at `streams`), at the highest
    such step both sustained (median over the rounds); their quotient is the linear-scaling
    figure, not bound by this box's cores as the throughput ratio is."""

    def sustained(count: str) -> dict[int, list[float]]:
        found: dict[int, list[float]] = {}
        for run in rounds.get(count, []):
            for step in run["steps"]:
                if step["sustained"] and step["cpu_us_per_delta"]:
                    found.setdefault(step["streams"], []).append(step["cpu_us_per_delta"])
        return found

    one, two = sustained("1"), sustained("2")
    both = [streams for streams in one if 2 * streams in two]
    if not both:
        return {}
    streams = max(both)
    one_us = statistics.median(one[streams])
    two_us = statistics.median(two[2 * streams])
    ratio = two_us / one_us
    return {
        "streams_per_worker": streams,
        "one_worker_us_per_delta": one_us,
        "two_workers_us_per_delta": two_us,
        "ratio": ratio,
        "target": TARGET_EQUAL_LOAD,
        "met": ratio <= TARGET_EQUAL_LOAD,
    }


OURS = ("service_cores", "provider_cores", "client_cores", "redis_cores", "postgres_cores")


def ceiling(one_worker: dict[str, Any], cpus: int) -> dict[str, float]:
    """What this box allows, from the CPU that one worker's best step cost per delta.

    Everything the benchmark runs (service, provider, load client, Redis, PostgreSQL)
    costs `total_us` of CPU per delta, so the box's cores carry at most `box_per_s`
    deltas/s, however many workers; one worker, a process on one core (gRPC's
    completion-queue thread aside), carries at most `one_worker_per_s` of them; their
    quotient bounds the ratio 2 workers can reach here on an otherwise idle box. CPU per
    delta counts every delta delivered over the step (a run's own cost included); the
    quotient is the service's share of the cores the benchmark used, times the cores.
    """
    best = one_worker.get("at_capacity") or {}
    if not best or not best["service_cores"] or not best["cpu_us_per_delta"]:
        return {}
    service_us = best["cpu_us_per_delta"]  # the service's CPU over the deltas delivered
    total_us = service_us * sum(best[key] for key in OURS) / best["service_cores"]
    box = cpus * 1e6 / total_us
    one = min(1e6 / service_us, box)
    return {
        "total_us_per_delta": total_us,
        "service_us_per_delta": service_us,
        "box_per_s": box,
        "one_worker_per_s": one,
        "ratio": box / one,
    }


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    """The services' files, under `var/bench/` (not /tmp: see `bench.serve._data_root`)."""
    base = Path(os.environ.get("AGW_BENCH_DATA_ROOT") or ROOT / "var" / "bench")
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="agw-workers-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def markdown(results: dict[str, Any]) -> str:
    """The report: the sustained rate of each worker count, the ratio, and where the CPU went."""
    meta = results["meta"]
    lines = [
        "## Workers: 1 vs 2 on one port (Redis run bus, PostgreSQL state)",
        "",
        f"{meta['started_at']}, {meta['cpus']} CPUs, event loop {meta['event_loop']}, load average "
        f"{meta['loadavg_before'][0]:.2f} before and {meta['loadavg_after'][0]:.2f} after, "
        f"{meta['duration_s']:.0f} s.",
        "",
        "| workers | highest sustained paced rate (best; each round) | CPU per delta | service "
        "| provider | load client | redis | postgres | others' work | whole machine "
        "| first step not sustained |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for count, run in results["workers"].items():
        best = run["at_capacity"] or {}
        miss = run["first_unsustained"]
        missed = (
            f"{miss['offered_per_s']:,.0f}/s offered: {miss['rate_per_s']:,.0f}/s at "
            f"{miss['pace']:.0%} pace, machine {miss['machine_cores']:.2f} cores"
            if miss
            else "none (ramp's end)"
        )
        each = ", ".join(f"{rate:,.0f}" for rate in run["rounds_per_s"])
        lines.append(
            f"| {count} | {run['capacity_per_s']:,.0f} deltas/s ({each}) | "
            f"{best.get('cpu_us_per_delta', 0):.1f} µs | "
            + " | ".join(
                f"{best.get(key, 0):.2f} cores"
                for key in (
                    "service_cores",
                    "provider_cores",
                    "client_cores",
                    "redis_cores",
                    "postgres_cores",
                    "others_cores",
                    "machine_cores",
                )
            )
            + f" | {missed} |"
        )
    verdict = "met" if results["met"] else "not met"
    lines += [
        "",
        f"2 workers ÷ 1 worker: **{results['ratio']:.2f}×** (target ≥ {results['target']}×: "
        f"{verdict}). CPU columns: cores used on average at the highest sustained step; "
        "others' work: the rest of the machine's busy time (not this benchmark's).",
    ]
    equal = results.get("equal_load") or {}
    if equal:
        lines += [
            "",
            f"At equal load per worker ({equal['streams_per_worker']} streams, 50 deltas/s "
            f"each, per worker): service CPU per delta {equal['one_worker_us_per_delta']:.1f} µs"
            f" with 1 worker, {equal['two_workers_us_per_delta']:.1f} µs with 2: "
            f"**{equal['ratio']:.2f}×** (target ≤ {equal['target']:.2f}×, what 1.7× needs "
            f"with a core per worker: {'met' if equal['met'] else 'NOT met'}).",
        ]
    bound = results.get("ceiling") or {}
    if bound:
        lines += [
            "",
            f"What this box allows: at one worker's best step, everything measured cost "
            f"{bound['total_us_per_delta']:.0f} µs of CPU per delta delivered, "
            f"{bound['service_us_per_delta']:.0f} µs of it in the service "
            f"({bound['service_us_per_delta'] / bound['total_us_per_delta']:.0%}). The "
            f"{meta['cpus']} cores bound the rate whatever the number of workers, one worker "
            f"(one process, about one core) bounds it too: on an otherwise idle box, 2 "
            f"workers can reach at most {bound['ratio']:.2f}× one.",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.workers", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    parser.add_argument("--ramp-streams", type=int, default=None)
    parser.add_argument("--ramp-step", type=int, default=None)
    parser.add_argument("--ramp-max-streams", type=int, default=None)
    parser.add_argument("--ramp-deltas", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=2, help="ramps of each count, alternating")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="JSON results file ('' = none)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else DEFAULT
    overrides = {
        name: getattr(args, name)
        for name in ("ramp_streams", "ramp_step", "ramp_max_streams", "ramp_deltas")
        if getattr(args, name) is not None
    }
    sizes = dataclasses.replace(sizes, **overrides)
    measured = measure(sizes, rounds_=max(1, args.rounds))
    results = eventloop.run(measured, os.environ.get("AGW_EVENT_LOOP", "auto"))
    results["markdown"] = markdown(results)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
        out.with_suffix(".md").write_text(results["markdown"] + "\n")
    print(results["markdown"])


def _progress(message: str) -> None:
    print(f"bench: {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


# Steps of 1,000 deltas/s from 2,000/s: fine enough for a ratio, 2 s of deltas each.
# Each worker gets `channels` client connections (bench.options: 4, as the main bench).
DEFAULT = Sizes(ramp_streams=40, ramp_step=20, ramp_max_streams=600, ramp_deltas=100)
QUICK = Sizes(
    ramp_streams=4, ramp_step=4, ramp_max_streams=8, ramp_deltas=5, stagger_ms=40.0, channels=2
)


if __name__ == "__main__":
    main()
