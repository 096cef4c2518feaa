"""`python -m bench.replicas`: one gateway on embedded state vs three replicas on Postgres+Redis.

In one run, against the same loopback provider (its own process):

- **1 process**: the gateway on its embedded defaults (JSONL chats, run logs on
  disk, the in-process run bus). Every stream is queried on it and followed by a
  second client attached (`Attach`) to the same run on it.
- **3 replicas**: three gateway processes sharing a throwaway PostgreSQL
  (`AGW_CHAT_STORE`, `AGW_RUN_LOG`, uploads) and a throwaway Redis
  (`AGW_RUN_BUS=redis`). Stream *i* is queried on replica *i* mod 3 and followed
  on the next replica, so every follower reads the run through Redis.

Same streams in both (paced, stamped deltas); rounds alternate which setup goes
first. The figures: CPU per upstream delta of every server process (gateways,
and for the replicas `redis-server` and PostgreSQL too), and each delta's latency
at the querying client and at the follower (p50/p99), with the ratio replicas ÷
single — the follower's added p50 is what the Redis hop costs a delta end to end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw

from bench.load import Target
from bench.procs import ROOT, Child, replica_env, spawn, tree_cpu_ns
from bench.protocol import AGENT_KEY, StreamSpec, parse_stamp
from bench.scenarios import percentile
from service.process import eventloop
from service.testing import PostgresServer, RedisServer

REPLICAS = 3
TARGET_CPU_RATIO = 1.5  # 3 replicas' CPU per delta over 1 process's


@dataclass
class Window:
    """One setup's figures over one round."""

    cpu_ns: int = 0
    cpu_ns_by_role: dict[str, int] = field(default_factory=dict)  # gateway, redis, postgres
    deltas: int = 0
    expected: int = 0
    query_ns: list[int] = field(default_factory=list)
    follow_ns: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def _read(call: Any, into: list[int], first: asyncio.Future[str] | None = None) -> None:
    """Read a stream to its end; each content delta's latency (arrival - stamp) into `into`."""
    while True:
        read = await call.read()
        if read is grpc.aio.EOF:
            return
        event = cast(pb.Event, read)
        if first is not None and not first.done():
            first.set_result(event.run_id)
        if event.type == "content.delta":
            into.append(time.monotonic_ns() - parse_stamp(event.content_delta.delta)[0])


async def query_and_follow(
    origin: Target, follower: Target, spec: StreamSpec, window: Window
) -> None:
    """Query on `origin`; as soon as the run is known, follow it from seq 0 on `follower`."""
    call = origin.stub().Query(gw.QueryRequest(agent_key=AGENT_KEY, message=spec.to_message()))
    run_id: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    querying = asyncio.ensure_future(_read(call, window.query_ns, run_id))
    try:
        attach = follower.stub().Attach(gw.AttachRequest(run_id=await run_id, after_seq=0))
        await asyncio.gather(querying, _read(attach, window.follow_ns))
    except grpc.aio.AioRpcError as error:
        window.errors.append(f"{error.code().name}: {error.details()}")
    finally:
        querying.cancel()


async def measure(pids: dict[int, str], targets: list[Target], specs: list[StreamSpec]) -> Window:
    """`pids`: the server processes measured, each with its role."""
    window = Window(expected=sum(s.deltas for s in specs))
    before = {pid: tree_cpu_ns(pid) for pid in pids}
    count = len(targets)
    await asyncio.gather(
        *(
            query_and_follow(targets[n % count], targets[(n + 1) % count], spec, window)
            for n, spec in enumerate(specs)
        )
    )
    for pid, role in pids.items():
        used = tree_cpu_ns(pid) - before[pid]
        window.cpu_ns_by_role[role] = window.cpu_ns_by_role.get(role, 0) + used
    window.cpu_ns = sum(window.cpu_ns_by_role.values())
    window.deltas = len(window.query_ns)
    return window


async def run(args: argparse.Namespace) -> dict[str, Any]:
    children: list[Child] = []
    targets: list[Target] = []
    with RedisServer.start() as redis_server, PostgresServer.start() as postgres:
        try:
            provider = await spawn("provider")
            children.append(provider)
            url = f"http://127.0.0.1:{provider.port}/v1"
            limit = str(args.streams * 2 + 100)
            single = await spawn("gateway", "--provider-url", url, "--max-streams", limit)
            children.append(single)
            shared = replica_env(postgres, redis_server, "agw_bench")
            replicas = []
            for n in range(REPLICAS):  # one at a time: the first one migrates the database
                env = {**shared, "AGW_REPLICA_ID": f"bench-{n}"}
                replica = await spawn(
                    "gateway", "--provider-url", url, "--max-streams", limit, env=env
                )
                children.append(replica)
                replicas.append(replica)
            setups = {
                "single": ({single.pid: "gateway"}, [Target("single", single.port)]),
                "replicas": (
                    {r.pid: "gateway" for r in replicas}
                    | {
                        p.process.pid: role
                        for role, p in (("redis", redis_server), ("postgres", postgres))
                        if p.process is not None
                    },
                    [Target(f"replica-{n}", r.port) for n, r in enumerate(replicas)],
                ),
            }
            for _, (_, setup_targets) in setups.items():
                targets += setup_targets
                for target in setup_targets:
                    await target.ready()
            specs = [
                StreamSpec(
                    args.deltas, args.interval_ms, phase_ms=args.interval_ms * n / args.streams
                )
                for n in range(args.streams)
            ]
            warm = [StreamSpec(5)] * 6
            for pids, setup_targets in setups.values():
                await measure(pids, setup_targets, warm)
            windows: dict[str, list[Window]] = {name: [] for name in setups}
            for number in range(args.rounds):
                order = list(setups) if number % 2 == 0 else list(reversed(setups))
                for name in order:
                    print(f"bench.replicas: round {number + 1} {name}", file=sys.stderr)
                    pids, setup_targets = setups[name]
                    windows[name].append(await measure(pids, setup_targets, specs))
            return summarize(args, windows)
        finally:
            for target in targets:
                await target.close()
            for child in reversed(children):
                await child.stop()


def summarize(args: argparse.Namespace, windows: dict[str, list[Window]]) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "streams": args.streams,
        "deltas": args.deltas,
        "interval_ms": args.interval_ms,
        "rounds": args.rounds,
    }
    for name, measured in windows.items():
        deltas = sum(w.deltas for w in measured)
        query = [x for w in measured for x in w.query_ns]
        follow = [x for w in measured for x in w.follow_ns]
        figures[name] = {
            "cpu_per_delta_us": sum(w.cpu_ns for w in measured) / max(deltas, 1) / 1e3,
            "cpu_per_delta_us_by_role": {
                role: sum(w.cpu_ns_by_role.get(role, 0) for w in measured) / max(deltas, 1) / 1e3
                for role in sorted({r for w in measured for r in w.cpu_ns_by_role})
            },
            "delivered": deltas,
            "followed": len(follow),
            "expected": sum(w.expected for w in measured),
            "query_p50_us": percentile(query, 50) / 1e3,
            "query_p99_us": percentile(query, 99) / 1e3,
            "follow_p50_us": percentile(follow, 50) / 1e3,
            "follow_p99_us": percentile(follow, 99) / 1e3,
            "errors": [e for w in measured for e in w.errors][:5],
        }
    one, three = figures["single"], figures["replicas"]
    figures["cpu_ratio"] = three["cpu_per_delta_us"] / one["cpu_per_delta_us"]
    figures["follow_added_p50_us"] = three["follow_p50_us"] - one["follow_p50_us"]
    figures["load_average"] = os.getloadavg()[0]
    figures["target_cpu_ratio"] = TARGET_CPU_RATIO
    return figures


def markdown(f: dict[str, Any]) -> str:
    one, three = f["single"], f["replicas"]
    met = "met" if f["cpu_ratio"] <= f["target_cpu_ratio"] else "NOT met"

    def row(label: str, key: str, unit: str = "µs", digits: int = 0) -> str:
        a, b = one[key], three[key]
        ratio = b / a if a else 0.0
        return f"| {label} | {a:.{digits}f} {unit} | {b:.{digits}f} {unit} | {ratio:.2f}× |"

    return "\n".join(
        [
            f"1 process (embedded) vs {REPLICAS} replicas (Postgres + Redis): {f['streams']} "
            f"streams × {f['deltas']} deltas, {f['interval_ms']:g} ms apart, each queried and "
            f"followed, {f['rounds']} rounds",
            "",
            f"| figure | 1 process | {REPLICAS} replicas | replicas ÷ 1 |",
            "|---|---|---|---|",
            row("CPU per delta, every server process", "cpu_per_delta_us", digits=1),
            row("delta latency p50, querying client", "query_p50_us"),
            row("delta latency p99, querying client", "query_p99_us"),
            row("delta latency p50, follower (another replica)", "follow_p50_us"),
            row("delta latency p99, follower", "follow_p99_us"),
            f"| deltas delivered / followed | {one['delivered']} / {one['followed']} of "
            f"{one['expected']} | {three['delivered']} / {three['followed']} of "
            f"{three['expected']} | |",
            "| CPU per delta of the replicas by process kind | | "
            + ", ".join(
                f"{role} {us:.1f} µs" for role, us in three["cpu_per_delta_us_by_role"].items()
            )
            + " | |",
            "",
            f"Target: {REPLICAS} replicas ÷ 1 process ≤ {f['target_cpu_ratio']:g}× CPU per delta: "
            f"{f['cpu_ratio']:.2f}× ({met}). The Redis hop adds "
            f"{f['follow_added_p50_us']:.0f} µs p50 to a followed delta (end to end, through "
            f"gRPC; `bench.redis_hop` isolates it). Load average {f['load_average']:.2f}.",
        ]
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.replicas", description=__doc__)
    parser.add_argument("--streams", type=int, default=30)
    parser.add_argument("--deltas", type=int, default=200)
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--out",
        type=str,
        default=str(ROOT / "bench" / "results" / "replicas.json"),
        help="JSON results file ('' = none)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    figures = eventloop.run(run(args), os.environ.get("AGW_EVENT_LOOP", "auto"))
    print(markdown(figures))
    if args.out:
        with open(args.out, "w") as out:
            json.dump(figures, out, indent=2)
            out.write("\n")


if __name__ == "__main__":
    main()
