"""`python -m bench.durability`: what durable runs cost, and how soon a lost run goes on.

1. **Checkpoint cost.** The same gateway twice, against the same loopback provider:
   with its runs journaled (`AGW_RUN_JOURNAL=files`, the embedded default: every event
   and step written to SQLite before readers see it) and without (`none`). The same
   paced streams on each, rounds alternating which goes first; CPU per delta of each
   gateway process, and CPU per 1-delta call (a run's fixed cost). Target: journaled ÷
   not journaled ≤ 1.05 per paced delta.
2. **Resume latency.** Three replicas on PostgreSQL + Redis (`AGW_RUN_JOURNAL=postgres`,
   lease `--lease` s). Runs stream slowly on one replica and are followed on another;
   the owner is killed (SIGKILL). For each run, the time from the kill to its
   `run.resume` at the follower: the lease running out, another replica declaring the
   owner lost, adopting the run (fenced) and resuming it from its journal. Target: p99 ≤
   lease + 2 s.

    python -m bench.durability [--quick] [--rounds 3] [--streams 100] [--runs 20] [--lease 2]

Prints the figures in Markdown and, with `--out`, writes them as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, cast

import grpc
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw

from bench.load import Target, run_stream
from bench.procs import Child, replica_env, spawn, tree_cpu_ns
from bench.protocol import AGENT_KEY, HOST, StreamSpec
from bench.scenarios import percentile
from service.process import eventloop
from service.testing import PostgresServer, RedisServer

CHECKPOINT_TARGET = 1.05  # journaled ÷ not journaled, CPU per paced delta
RESUME_MARGIN_S = 2.0  # resume p99 within the lease and this


# -- checkpoint cost -------------------------------------------------------------------


async def paced(target: Target, pid: int, streams: int, deltas: int, interval_ms: float) -> float:
    """CPU of process `pid` per delta while `streams` paced streams run on it (ns)."""
    specs = [
        StreamSpec(deltas, interval_ms, phase_ms=interval_ms * n / streams) for n in range(streams)
    ]
    before = tree_cpu_ns(pid)
    results = await asyncio.gather(*(run_stream(target, spec) for spec in specs))
    used = tree_cpu_ns(pid) - before
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"{len(errors)} streams failed: {errors[0]}")
    return used / sum(r.deltas for r in results)


async def calls(target: Target, pid: int, count: int) -> float:
    """CPU of process `pid` per 1-delta call, `count` calls 8 at a time (ns)."""
    before = tree_cpu_ns(pid)
    for lo in range(0, count, 8):
        batch = [run_stream(target, StreamSpec(1)) for _ in range(min(8, count - lo))]
        await asyncio.gather(*batch)
    return (tree_cpu_ns(pid) - before) / count


async def checkpoint_cost(args: argparse.Namespace) -> dict[str, Any]:
    children: list[Child] = []
    targets: dict[str, Target] = {}
    try:
        provider = await spawn("provider")
        children.append(provider)
        url = f"http://{HOST}:{provider.port}/v1"
        limit = str(args.streams * 2 + 50)
        gateways: dict[str, Child] = {}
        for name, journal in (("journaled", "files"), ("not journaled", "none")):
            gateway = await spawn(
                "gateway",
                "--provider-url",
                url,
                "--max-streams",
                limit,
                env={"AGW_RUN_JOURNAL": journal},
            )
            children.append(gateway)
            gateways[name] = gateway
            targets[name] = Target(name, gateway.port)
            await targets[name].ready()
        for name, gateway in gateways.items():  # warm up
            await calls(targets[name], gateway.pid, 20)
        per_delta: dict[str, list[float]] = {name: [] for name in gateways}
        per_call: dict[str, list[float]] = {name: [] for name in gateways}
        for number in range(args.rounds):
            order = list(gateways) if number % 2 == 0 else list(reversed(gateways))
            for name in order:
                print(f"bench.durability: round {number + 1} {name}", file=sys.stderr)
                pid = gateways[name].pid
                per_delta[name].append(
                    await paced(targets[name], pid, args.streams, args.deltas, args.interval_ms)
                )
                per_call[name].append(await calls(targets[name], pid, args.calls))
    finally:
        for target in targets.values():
            await target.close()
        for child in reversed(children):
            await child.stop()
    delta_us = {name: min(values) / 1000 for name, values in per_delta.items()}
    call_us = {name: min(values) / 1000 for name, values in per_call.items()}
    ratio = delta_us["journaled"] / delta_us["not journaled"]
    return {
        "streams": args.streams,
        "deltas": args.deltas,
        "interval_ms": args.interval_ms,
        "rounds": args.rounds,
        "cpu_per_delta_us": delta_us,
        "cpu_per_call_us": call_us,
        "delta_ratio": round(ratio, 3),
        "call_ratio": round(call_us["journaled"] / call_us["not journaled"], 3),
        "delta_ratios": [
            round(a / b, 3)
            for a, b in zip(per_delta["journaled"], per_delta["not journaled"], strict=True)
        ],
        "target": CHECKPOINT_TARGET,
        "met": ratio <= CHECKPOINT_TARGET,
    }


# -- resume latency --------------------------------------------------------------------


async def follow_until_resumed(
    target: Target,
    run_id: str,
    resumed: dict[str, float],
    ended: dict[str, str],
    all_resumed: tuple[int, asyncio.Event],
) -> None:
    """Follow `run_id` to its end; note when its `run.resume` arrived (`all_resumed`: set
    once that many have), and how it ended."""
    call = target.stub().Attach(gw.AttachRequest(run_id=run_id))
    try:
        while True:
            read = await call.read()
            if read is grpc.aio.EOF:
                return
            event = cast(pb.Event, read)
            if event.type == "run.resume" and run_id not in resumed:
                resumed[run_id] = time.monotonic()
                if len(resumed) == all_resumed[0]:
                    all_resumed[1].set()
            if event.type.startswith("run.") and event.type not in ("run.start", "run.resume"):
                ended[run_id] = event.type
    except grpc.aio.AioRpcError as error:
        ended[run_id] = f"{error.code().name}: {error.details()}"


async def resume_latency(args: argparse.Namespace) -> dict[str, Any]:
    children: list[Child] = []
    targets: list[Target] = []
    with RedisServer.start() as redis_server, PostgresServer.start() as postgres:
        try:
            provider = await spawn("provider")
            children.append(provider)
            url = f"http://{HOST}:{provider.port}/v1"
            shared = {
                **replica_env(postgres, redis_server, "agw_durability"),
                "AGW_RUN_JOURNAL": "postgres",
                "AGW_REDIS_LEASE_TTL_S": f"{args.lease:g}",
            }
            replicas = []
            for n in range(3):  # one at a time: the first one migrates the database
                env = {**shared, "AGW_REPLICA_ID": f"durable-{n}"}
                replica = await spawn("gateway", "--provider-url", url, env=env)
                children.append(replica)
                replicas.append(replica)
                targets.append(Target(f"replica-{n}", replica.port))
                await targets[-1].ready()
            owner, follower = targets[0], targets[1]
            # Slow runs: 1 delta a second for a minute; the owner dies a second in.
            spec = StreamSpec(60, 1000.0)
            request = gw.QueryRequest(agent_key=AGENT_KEY, message=spec.to_message())
            starting = [owner.stub().Query(request) for _ in range(args.runs)]
            run_ids = []
            for call in starting:
                async for event in call:
                    if event.type == "content.delta":
                        run_ids.append(event.run_id)
                        break
            resumed: dict[str, float] = {}
            ended: dict[str, str] = {}
            done = (len(run_ids), asyncio.Event())
            following = [
                asyncio.create_task(follow_until_resumed(follower, r, resumed, ended, done))
                for r in run_ids
            ]
            await asyncio.sleep(1.0)
            killed = time.monotonic()
            await replicas[0].kill()
            for call in starting:
                call.cancel()
            with contextlib.suppress(TimeoutError):  # reported: fewer resumed than killed
                await asyncio.wait_for(done[1].wait(), args.lease * 3 + 30)
            for task in following:
                task.cancel()
            await asyncio.gather(*following, return_exceptions=True)
        finally:
            for target in targets:
                await target.close()
            for child in reversed(children):
                await (child.stop() if child.process.returncode is None else child.kill())
    latencies = [resumed[r] - killed for r in run_ids if r in resumed]
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    bound = args.lease + RESUME_MARGIN_S
    return {
        "runs": len(run_ids),
        "resumed": len(latencies),
        "lease_s": args.lease,
        "p50_s": round(p50, 3),
        "p99_s": round(p99, 3),
        "max_s": round(max(latencies, default=0.0), 3),
        "bound_s": bound,
        "met": len(latencies) == len(run_ids) and p99 <= bound,
    }


# -- report ----------------------------------------------------------------------------


def markdown(figures: dict[str, Any]) -> str:
    cost, resume = figures["checkpoint"], figures["resume"]
    delta, call = cost["cpu_per_delta_us"], cost["cpu_per_call_us"]

    def met(ok: bool) -> str:
        return "met" if ok else "**not met**"

    ranges = ", ".join(f"{r:.2f}" for r in cost["delta_ratios"])
    return "\n".join(
        [
            "| figure | journaled | not journaled | ratio | target | |",
            "|---|---|---|---|---|---|",
            f"| CPU per delta, paced ({cost['streams']} streams × "
            f"{1000 / cost['interval_ms']:g}/s) | {delta['journaled']:.1f} µs "
            f"| {delta['not journaled']:.1f} µs | {cost['delta_ratio']:.2f}× "
            f"(rounds: {ranges}) | ≤ {cost['target']:g}× | {met(cost['met'])} |",
            f"| CPU per 1-delta call | {call['journaled']:.0f} µs "
            f"| {call['not journaled']:.0f} µs | {cost['call_ratio']:.2f}× | | |",
            "",
            "| resume after the owner is killed | value | target | |",
            "|---|---|---|---|",
            f"| runs resumed | {resume['resumed']} of {resume['runs']} | all | |",
            f"| kill → `run.resume` at a follower, p50 / p99 / max (lease "
            f"{resume['lease_s']:g} s) | {resume['p50_s']:.2f} / {resume['p99_s']:.2f} / "
            f"{resume['max_s']:.2f} s | p99 ≤ {resume['bound_s']:g} s | {met(resume['met'])} |",
        ]
    )


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    return {"checkpoint": await checkpoint_cost(args), "resume": await resume_latency(args)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.durability", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the checkpoint load")
    parser.add_argument("--streams", type=int, default=100, help="paced streams per round")
    parser.add_argument("--deltas", type=int, default=150, help="deltas per paced stream")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="between deltas")
    parser.add_argument("--calls", type=int, default=200, help="1-delta calls per round")
    parser.add_argument("--runs", type=int, default=20, help="runs in flight when killed")
    parser.add_argument("--lease", type=float, default=2.0, help="AGW_REDIS_LEASE_TTL_S")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    parser.add_argument("--out", default="", help="write the figures as JSON here ('' = none)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.streams, args.deltas, args.calls, args.runs = 1, 10, 20, 20, 3
    figures = eventloop.run(measure(args), os.environ.get("AGW_EVENT_LOOP", "auto"))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    print(markdown(figures))


if __name__ == "__main__":
    main()
