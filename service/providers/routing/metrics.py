"""Metrics of deployments, through the OpenTelemetry API (no-ops until the SDK is installed).

Each attempt of an alias's call on a deployment counts once in `agw.deployment.calls`
(with its outcome: `ok`, or the failure that moved the call on or ended it) and records
its duration; one that streamed records its time to first delta, its tokens and its
cost. Attributes: `agw.alias`, `agw.deployment`, `gen_ai.provider.name`,
`gen_ai.request.model` (the deployment's), plus `agw.outcome` on calls and durations,
`gen_ai.token.type` on tokens.
"""

from __future__ import annotations

from opentelemetry import metrics

from service.core.model import Usage
from service.providers.routing.deployment import Deployment

meter = metrics.get_meter("agw")

calls = meter.create_counter(
    "agw.deployment.calls", unit="{call}", description="Attempts of alias calls, by outcome"
)
errors = meter.create_counter(
    "agw.deployment.errors", unit="{call}", description="Attempts that failed, by failure"
)
duration = meter.create_histogram(
    "agw.deployment.duration", unit="s", description="Duration of an attempt on a deployment"
)
time_to_first_delta = meter.create_histogram(
    "agw.deployment.time_to_first_delta",
    unit="s",
    description="From an attempt's request to its first delta",
)
tokens = meter.create_counter(
    "agw.deployment.tokens", unit="{token}", description="Tokens used on a deployment"
)
cost = meter.create_counter(
    "agw.deployment.cost", unit="1", description="Cost on a deployment, in the price's currency"
)


def attributes(alias: str, deployment: Deployment) -> dict[str, str]:
    options = deployment.options
    return {
        "agw.alias": alias,
        "agw.deployment": options.name,
        "gen_ai.provider.name": options.provider,
        "gen_ai.request.model": options.model,
    }


def attempt(
    labels: dict[str, str],
    outcome: str,
    seconds: float,
    first_delta_s: float | None,
    usage: Usage | None,
    price_cost: float | None,
) -> None:
    """Record one attempt's metrics."""
    calls.add(1, {**labels, "agw.outcome": outcome})
    if outcome != "ok":
        errors.add(1, {**labels, "error.type": outcome})
    duration.record(seconds, {**labels, "agw.outcome": outcome})
    if first_delta_s is not None:
        time_to_first_delta.record(first_delta_s, labels)
    if usage is not None:
        tokens.add(usage.prompt_tokens, {**labels, "gen_ai.token.type": "input"})
        tokens.add(usage.completion_tokens, {**labels, "gen_ai.token.type": "output"})
    if price_cost:
        cost.add(price_cost, labels)
