"""Rate limits and calls in flight of deployments: in this process, or shared (Redis).

Before a call is made on a deployment, the limiter reserves it: one call of the
deployment's calls-per-minute and the prompt's estimated tokens of its tokens-per-minute
(the window is the current minute), and one call in flight. A deployment at a limit is
refused (`LimitReached`): the call moves to the next deployment without having called
this one. When the call ends, the reservation is released, with the tokens it really
used in place of the estimate. A call that alone is larger than the token limit may
still go when the minute is fresh (it would never go otherwise).

`LocalLimiter` counts in this process. `service.providers.routing.redis_limits` shares
the counts between replicas; both give the calls in flight of each deployment to the
least-busy strategy (`busy`), from memory: nothing of this is on the per-delta path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from service.providers.routing.deployment import DeploymentOptions
from service.providers.routing.failures import LimitReached

WINDOW_S = 60


@dataclass(slots=True)
class Reservation:
    """One call reserved on a deployment."""

    deployment: DeploymentOptions
    tokens: int  # reserved for it (the estimate)
    window: int  # the minute it was counted in
    call_id: str = ""
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Usage:
    """A deployment's counts: calls in flight, and this minute's calls and tokens."""

    in_flight: int = 0
    calls: int = 0
    tokens: int = 0


class Limiter(Protocol):
    """Reserves calls on deployments, within their limits."""

    shared: bool  # its counts are every replica's

    async def reserve(self, deployment: DeploymentOptions, tokens: int) -> Reservation:
        """Reserve a call of `tokens` (estimated) on `deployment`, or raise `LimitReached`."""
        ...

    async def release(self, reservation: Reservation, tokens: int | None) -> None:
        """The call ended, having used `tokens` (None: unknown, the estimate stands)."""
        ...

    def busy(self, deployment: str) -> int:
        """The deployment's calls in flight, as last known (no I/O)."""
        ...

    def track(self, deployments: Iterable[str]) -> None:
        """The deployments whose calls in flight `busy` is asked about."""
        ...

    async def usage(self, deployment: DeploymentOptions) -> Usage:
        """The deployment's counts now."""
        ...

    async def aclose(self) -> None: ...


def refusal(deployment: DeploymentOptions, calls: int, tokens: int, asked: int) -> str:
    """The limit a reservation of `asked` tokens would break ("" when none)."""
    if deployment.rpm and calls >= deployment.rpm:
        return "rpm"
    if deployment.tpm and tokens and tokens + asked > deployment.tpm:
        return "tpm"
    return ""


def limit_reached(deployment: DeploymentOptions, limit: str) -> LimitReached:
    value = deployment.rpm if limit == "rpm" else deployment.tpm
    return LimitReached(deployment.name, deployment.provider, limit, value)


class LocalLimiter:
    """The limits of this process's calls."""

    shared = False

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._windows: dict[str, tuple[int, int, int]] = {}  # name -> (minute, calls, tokens)
        self._busy: dict[str, int] = {}

    def _window(self, name: str) -> tuple[int, int, int]:
        minute = int(self._clock() // WINDOW_S)
        window = self._windows.get(name)
        if window is None or window[0] != minute:
            window = self._windows[name] = (minute, 0, 0)
        return window

    async def reserve(self, deployment: DeploymentOptions, tokens: int) -> Reservation:
        name = deployment.name
        minute, calls, used = self._window(name)
        limit = refusal(deployment, calls, used, tokens)
        if limit:
            raise limit_reached(deployment, limit)
        self._windows[name] = (minute, calls + 1, used + tokens)
        self._busy[name] = self._busy.get(name, 0) + 1
        return Reservation(deployment, tokens, minute)

    async def release(self, reservation: Reservation, tokens: int | None) -> None:
        name = reservation.deployment.name
        self._busy[name] = max(0, self._busy.get(name, 0) - 1)
        window = self._windows.get(name)
        if tokens is not None and window is not None and window[0] == reservation.window:
            self._windows[name] = (window[0], window[1], window[2] + tokens - reservation.tokens)

    def busy(self, deployment: str) -> int:
        return self._busy.get(deployment, 0)

    def track(self, deployments: Iterable[str]) -> None:
        pass  # every call of this process is counted as it is reserved

    async def usage(self, deployment: DeploymentOptions) -> Usage:
        _, calls, tokens = self._window(deployment.name)
        return Usage(self._busy.get(deployment.name, 0), calls, max(0, tokens))

    async def aclose(self) -> None:
        pass
