"""`python -m bench.routing`: what a model alias costs a call, and what a failed deployment costs.

*Routing CPU per call.* The same call — a one-delta stream of an in-process model, no
socket — is made through an alias of three deployments (each strategy) and straight
through the deployment's client; the CPU time of this process over `--calls` calls,
routed minus direct, divided by the calls, is routing's cost per call (target: at most
20 µs). The best of `--rounds` rounds is kept (the machine is shared: the least
disturbed round is the closest to the cost). A long stream (`--deltas` deltas) gives
the relay's cost per delta.

*A failed first deployment.* Two fake providers on loopback (real HTTP): the first
answers 503, the second streams. A call of the alias makes one request to each — one
extra round trip, not a retry storm (target: 2 requests; the deployments' clients do not
retry) — and takes about one round trip more than a call straight to the second
(measured: the added time next to a failed request's own time). The calls that follow,
while the first cools down, go straight to the second (target: 0 more requests to it).

    python -m bench.routing [--calls 20000] [--deltas 200] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from service.core.errors import ProviderError
from service.core.model import ModelClient, ModelDelta, ModelRequest
from service.providers.http import ProviderOptions
from service.providers.loopback import DONE, HttpError, LoopbackProvider, content, finish
from service.providers.openai import OpenAIChatClient
from service.providers.routing.deployment import (
    AliasOptions,
    Deployment,
    DeploymentOptions,
    Strategy,
)
from service.providers.routing.limits import LocalLimiter
from service.providers.routing.router import AliasClient

TARGET_US_PER_CALL = 20.0
TARGET_REQUESTS = 2
STRATEGIES: tuple[Strategy, ...] = ("ordered", "weighted", "least_busy", "latency")


class Model:
    """An in-process model answering `deltas` deltas at once (no socket, no pause)."""

    key = "bench"

    def __init__(self, deltas: int) -> None:
        self.items = [ModelDelta(content="x")] * (deltas - 1) + [ModelDelta(finish_reason="stop")]

    @asynccontextmanager
    async def stream(self, request: ModelRequest) -> AsyncIterator[AsyncIterator[ModelDelta]]:
        yield self._deltas()

    async def _deltas(self) -> AsyncIterator[ModelDelta]:
        for item in self.items:
            yield item

    async def aclose(self) -> None:
        pass


def alias_of(clients: list[ModelClient], strategy: Strategy, **options: Any) -> AliasClient:
    deployments = [
        Deployment(DeploymentOptions(name=f"d{n}", provider="p", model=f"m{n}", **options), c)
        for n, c in enumerate(clients)
    ]
    names = tuple(d.name for d in deployments)
    return AliasClient(AliasOptions("smart", names, strategy), deployments, LocalLimiter())


def request() -> ModelRequest:
    return ModelRequest(
        provider="smart", model="smart", messages=[{"role": "user", "content": "hi"}]
    )


async def cpu_per_call(client: ModelClient, calls: int) -> float:
    """CPU µs per call of `client`, its stream read to the end."""
    started = time.process_time()
    for _ in range(calls):
        async with client.stream(request()) as deltas:
            async for _ in deltas:
                pass
    return (time.process_time() - started) / calls * 1e6


async def routing_cost(calls: int, deltas: int, rounds: int) -> dict[str, Any]:
    """Routing's CPU per call, by strategy, and the relay's per delta."""
    one = Model(1)
    per_call: dict[str, list[float]] = {s: [] for s in STRATEGIES}
    per_delta: list[float] = []
    long = Model(deltas)
    for _ in range(rounds):
        direct = await cpu_per_call(one, calls)
        for strategy in STRATEGIES:
            routed = await cpu_per_call(alias_of([one, Model(1), Model(1)], strategy), calls)
            per_call[strategy].append(routed - direct)
        long_calls = max(1, calls // deltas)
        plain = await cpu_per_call(long, long_calls)
        through = await cpu_per_call(alias_of([long], "ordered"), long_calls)
        per_delta.append((through - plain - min(per_call["ordered"])) / deltas)
    return {
        "us_per_call": {s: min(v) for s, v in per_call.items()},
        "us_per_call_rounds": per_call,
        "us_per_delta": min(per_delta),
    }


async def read(client: ModelClient) -> None:
    async with client.stream(request()) as deltas:
        async for _ in deltas:
            pass


async def failed_first(calls: int) -> dict[str, Any]:
    """What a first deployment that fails costs a call, in requests and in time."""
    async with LoopbackProvider() as down, LoopbackProvider() as up:
        down.responder = lambda body: [HttpError(503, {"error": {"message": "down"}})]
        up.responder = lambda body: [content("ok"), finish("stop"), DONE]
        # a deployment's client: the provider's options, without retries of its own
        failing, answering = (
            OpenAIChatClient(name, ProviderOptions(base_url=server.url, max_retries=0))
            for name, server in (("down", down), ("up", up))
        )
        try:
            with contextlib.suppress(ProviderError):  # warm both pools
                await read(failing)
            await read(answering)
            straight, refused, routed, requests = [], [], [], []
            for _ in range(calls):
                alias = alias_of([failing, answering], "ordered")  # a fresh one: a is healthy
                asked = len(down.requests) + len(up.requests)
                t0 = time.perf_counter()
                await read(alias)
                routed.append(time.perf_counter() - t0)
                requests.append(len(down.requests) + len(up.requests) - asked)
                t0 = time.perf_counter()
                await read(answering)
                straight.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                with contextlib.suppress(ProviderError):
                    await read(failing)
                refused.append(time.perf_counter() - t0)
            before = len(down.requests)  # then, while the first cools down
            for _ in range(calls):
                await read(alias)
            while_cooling = len(down.requests) - before
        finally:
            await failing.aclose()
            await answering.aclose()
    return {
        "requests_per_failed_over_call": max(requests),
        "requests_to_it_while_cooling": while_cooling,
        "added_ms_p50": (statistics.median(routed) - statistics.median(straight)) * 1e3,
        "failed_request_ms_p50": statistics.median(refused) * 1e3,
        "straight_ms_p50": statistics.median(straight) * 1e3,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "routing": await routing_cost(args.calls, args.deltas, args.rounds),
        "failover": await failed_first(args.failover_calls),
    }


def markdown(figures: dict[str, Any]) -> str:
    routing, failover = figures["routing"], figures["failover"]
    worst = max(routing["us_per_call"].values())
    rows = [
        "| target | goal | measured | met |",
        "|---|---|---|---|",
        *(
            f"| routing CPU per call, {s} | ≤ {TARGET_US_PER_CALL:.0f} µs | {v:.1f} µs | "
            f"{'yes' if v <= TARGET_US_PER_CALL else 'no'} |"
            for s, v in routing["us_per_call"].items()
        ),
        f"| relay CPU per delta | (reported) | {routing['us_per_delta']:.2f} µs | |",
        f"| requests of a call whose first deployment fails | {TARGET_REQUESTS} (one extra) | "
        f"{failover['requests_per_failed_over_call']} | "
        f"{'yes' if failover['requests_per_failed_over_call'] == TARGET_REQUESTS else 'no'} |",
        f"| requests to it while it cools down | 0 | {failover['requests_to_it_while_cooling']} | "
        f"{'yes' if failover['requests_to_it_while_cooling'] == 0 else 'no'} |",
        f"| time a failed first deployment adds (p50) | ~ one failed round trip "
        f"({failover['failed_request_ms_p50']:.2f} ms) | {failover['added_ms_p50']:.2f} ms | |",
    ]
    return "\n".join(rows) + f"\n\nworst strategy: {worst:.1f} µs per call"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.routing", description=__doc__)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--deltas", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--failover-calls", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    figures = asyncio.run(run(args))
    print(json.dumps(figures, indent=2) if args.json else markdown(figures))


if __name__ == "__main__":
    main()
