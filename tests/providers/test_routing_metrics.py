"""Per-deployment metrics of alias calls, through the OpenTelemetry SDK's in-memory reader.

The SDK is installed once per process: this module shares the observability tests' reader.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from service.providers.loopback import DONE, HttpError, LoopbackProvider, content, finish, usage
from tests.observability.test_observability import READER, metric_points, sdk  # noqa: F401
from tests.providers.test_routing import agents, routed, servers  # noqa: F401


def points(name: str, deployment: str) -> list:
    return [p for p in metric_points(name) if p.attributes.get("agw.deployment") == deployment]


def total(name: str, deployment: str, attributes: dict[str, str] | None = None) -> float:
    """The sum (or count, for a histogram) of a metric's points for a deployment so far
    (the reader is the process's: other tests' calls count too)."""
    found = [
        p
        for p in points(name, deployment)
        if all(p.attributes.get(k) == v for k, v in (attributes or {}).items())
    ]
    return sum(getattr(p, "value", None) or getattr(p, "count", 0) for p in found)


NAMES = ("calls", "errors", "time_to_first_delta", "tokens", "cost")


async def test_each_deployment_counts_its_calls_errors_latency_tokens_and_cost(
    agents: Path,  # noqa: F811
    servers: dict[str, LoopbackProvider],  # noqa: F811
) -> None:
    before = {(n, d): total(f"agw.deployment.{n}", d) for n in NAMES for d in "ab"}
    servers["a"].enqueue([HttpError(503, "down")])
    servers["b"].enqueue([content("ok"), finish("stop"), usage(1000, 500), DONE])
    price = {"b": {"price": {"input_per_million": 2.0, "output_per_million": 8.0}}}
    async with routed(agents, servers, deployments=price) as gateway:
        await gateway.query("routed", "hi")
    grew = {k: total(f"agw.deployment.{k[0]}", k[1]) - v for k, v in before.items()}
    assert grew == {
        ("calls", "a"): 1,  # failed: unavailable
        ("calls", "b"): 1,
        ("errors", "a"): 1,
        ("errors", "b"): 0,
        ("time_to_first_delta", "a"): 0,  # it never streamed
        ("time_to_first_delta", "b"): 1,
        ("tokens", "a"): 0,
        ("tokens", "b"): 1500,
        ("cost", "a"): 0,
        ("cost", "b"): pytest.approx((1000 * 2.0 + 500 * 8.0) / 1_000_000),
    }
    assert total("agw.deployment.calls", "a", {"agw.outcome": "unavailable"}) >= 1
    assert total("agw.deployment.errors", "a", {"error.type": "unavailable"}) >= 1
    assert total("agw.deployment.tokens", "b", {"gen_ai.token.type": "input"}) >= 1000
    b = points("agw.deployment.duration", "b")[0].attributes
    assert (b["gen_ai.provider.name"], b["gen_ai.request.model"]) == ("pb", "model-b")
