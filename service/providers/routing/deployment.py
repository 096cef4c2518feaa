"""A model alias's deployments: what each is (options) and how it is doing (its state).

A deployment is one way of serving an alias: a provider key, a model, optionally one
of the provider's keys, with a weight, rate limits (calls and tokens per minute), a
context length and a price. Its state in this process: its circuit breaker (healthy,
cooling down after a failure, probing once cooled down), its calls in flight, its
recent time to first delta, its counts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

from service.core.model import ModelClient
from service.core.run.observation import Price

Strategy = Literal["ordered", "weighted", "least_busy", "latency"]
"""How a call picks among an alias's healthy deployments (the others keep their order
of preference as fallbacks): the first in order, at random by weight, the fewest calls
in flight, the lowest recent time to first delta."""

LATENCY_WEIGHT = 0.3  # of a new time to first delta in the deployment's moving average


@dataclass(frozen=True)
class DeploymentOptions:
    """One deployment, as configured (plain values; `service.assembly` builds them)."""

    name: str
    provider: str  # the provider key whose API and base URL it uses
    model: str
    key: str = ""  # one of the provider's named keys; "" for its api_key
    weight: float = 1.0
    rpm: int = 0  # calls per minute (0: no limit)
    tpm: int = 0  # tokens per minute, prompt and answer (0: no limit)
    context_length: int = 0  # tokens (0: not known)
    price: Price | None = None
    max_retries: int = 0  # the client's own retries before the first byte; 0: fall back
    cooldown_s: float = 30.0  # after a failure (a Retry-After wins), doubled at each repeat
    max_cooldown_s: float = 600.0


@dataclass(frozen=True)
class AliasOptions:
    """A model alias: its deployments in order of preference, and how calls pick one."""

    name: str
    deployments: tuple[str, ...]
    strategy: Strategy = "ordered"
    # After a call's first delta, a failure normally ends the run; with this, the call
    # starts over on the next deployment (its blocks closed, a model.fallback said).
    restart_on_failure: bool = False


class Breaker:
    """A deployment's circuit breaker.

    Healthy, it takes calls. A failure that is the deployment's (unreachable, time-out,
    rate limit, 5xx, key or model refused) cools it down: it takes no call for the
    provider's `Retry-After` if it gave one, else `cooldown_s`, doubled at each failure
    in a row up to `max_cooldown_s`. Cooled down, it is probed: one call tries it (the
    others pass it by) and its outcome closes the breaker or cools it down again.
    """

    __slots__ = ("cooldown_s", "failures", "max_cooldown_s", "probing", "reason", "until", "wall")

    def __init__(self, cooldown_s: float, max_cooldown_s: float) -> None:
        self.cooldown_s = cooldown_s
        self.max_cooldown_s = max_cooldown_s
        self.failures = 0  # in a row
        self.until = 0.0  # monotonic time it is cooling down until
        self.wall = 0.0  # the same, in seconds since the epoch (for the status)
        self.reason = ""
        self.probing = False  # a call is trying it

    @property
    def healthy(self) -> bool:
        return self.failures == 0

    def available(self, now: float) -> bool:
        """Whether a call may try it now."""
        return self.failures == 0 or (now >= self.until and not self.probing)

    def begin(self, now: float) -> bool:
        """A call is about to try it: False when it may not (cooling, or being probed)."""
        if self.failures == 0:
            return True
        if now < self.until or self.probing:
            return False
        self.probing = True
        return True

    def failed(self, now: float, reason: str, retry_after_s: float | None = None) -> float:
        """A call failed because of it: cool it down; returns for how long."""
        self.failures += 1
        wait = min(self.cooldown_s * 2.0 ** (self.failures - 1), self.max_cooldown_s)
        if retry_after_s is not None:
            wait = retry_after_s
        self.until = now + wait
        self.wall = time.time() + wait
        self.reason = reason
        self.probing = False
        return wait

    def succeeded(self) -> None:
        self.failures = 0
        self.reason = ""
        self.probing = False

    def ended(self) -> None:
        """A call that tried it ended without a verdict (cancelled, or not its fault)."""
        self.probing = False


@dataclass(eq=False)
class Deployment:
    """A deployment and its state in this process."""

    options: DeploymentOptions
    client: ModelClient
    breaker: Breaker = field(init=False)
    in_flight: int = 0
    latency_s: float = 0.0  # moving average of its time to first delta (0: no call yet)
    calls: int = 0
    failures: int = 0

    def __post_init__(self) -> None:
        self.breaker = Breaker(self.options.cooldown_s, self.options.max_cooldown_s)

    @property
    def name(self) -> str:
        return self.options.name

    def first_delta(self, seconds: float) -> None:
        """Note a call's time to first delta."""
        old = self.latency_s
        self.latency_s = seconds if not old else old + LATENCY_WEIGHT * (seconds - old)

    def state(self, now: float) -> str:
        """ "healthy", "cooling_down" or "probing" (cooled down, or a call trying it)."""
        breaker = self.breaker
        if breaker.healthy:
            return "healthy"
        return "probing" if breaker.probing or now >= breaker.until else "cooling_down"
