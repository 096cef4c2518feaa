"""The client of a model alias: each call goes to one of its deployments (a ModelClient).

`stream` plans the call: the deployments that may take it (not cooling down), those
known too small for the prompt last, ordered by the alias's strategy; it reports the
first attempt to the call's observer (`ModelRequest.report`) before anything is sent.
Entering the call tries the attempts in that order: each reserves the deployment
(its rate limits, and one call in flight: `limits.py`), opens the deployment's own
client and waits for the first delta. A failure before it that is the deployment's
(`failures.py`) cools the deployment down (its circuit breaker honours the
`Retry-After`) and moves the call to the next deployment — one more round trip, the
deployments' clients do not retry themselves by default. A prompt too long for a
deployment's context window moves on to a deployment with a longer one. The failed
attempt and the next one are reported; when none is left, the call fails with the last
error.

After the first delta nothing is switched silently: a failure ends the call (and so the
run), unless the alias opts into `restart_on_failure`: then the stream gives a
`ModelDelta(restart=...)` — the run closes what the failed attempt opened and says so
(`model.fallback`) — and the call goes on with the next deployment, as from its start
(a failure before its first delta moves on again, reported as before). The deltas
themselves pass through untouched, one for one.

Every attempt ends by closing its upstream stream (in the consumer's task, once),
releasing its reservation with the tokens it used, giving its deployment a verdict and
recording its metrics (`metrics.py`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from types import TracebackType

from service.core.errors import ProviderError
from service.core.model import Attempt, ModelDelta, ModelRequest, Restart, Usage
from service.core.run.transcript import estimate_tokens
from service.providers.routing import metrics
from service.providers.routing.deployment import AliasOptions, Deployment
from service.providers.routing.failures import Failure, classify
from service.providers.routing.limits import Limiter, Reservation

#: Failures that are the deployment's: they cool it down.
COOLING = frozenset({Failure.UNAVAILABLE, Failure.RATE_LIMITED, Failure.REFUSED})


class AliasClient:
    """`ModelClient` of one model alias (`key` is the alias's name)."""

    def __init__(
        self,
        options: AliasOptions,
        deployments: Sequence[Deployment],
        limiter: Limiter,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.key = options.name
        self.options = options
        self.deployments = list(deployments)
        self.limiter = limiter
        self.clock = clock
        self._rng = rng
        self.labels = {d.name: metrics.attributes(options.name, d) for d in self.deployments}
        if options.strategy == "least_busy":
            limiter.track(d.name for d in self.deployments)
        # The prompt's size is estimated only when a deployment has a use for it.
        self._estimate = any(d.options.context_length or d.options.tpm for d in self.deployments)

    def stream(self, request: ModelRequest) -> AliasCall:
        """Plan the call and report its first attempt; enter the result to make it."""
        tokens = estimate_tokens(request.messages) if self._estimate else 0
        call = AliasCall(self, request, self.plan(tokens), tokens)
        call.announce(call.plan[0], reported=True)
        return call

    def plan(self, tokens: int = 0) -> list[Deployment]:
        """The deployments a call of about `tokens` tokens tries, in order."""
        now = self.clock()
        ready = [d for d in self.deployments if d.breaker.available(now)]
        if not ready:
            raise self._unavailable(now)
        if tokens:
            small = [d for d in ready if 0 < d.options.context_length < tokens]
            if small:
                return self._order([d for d in ready if d not in small]) + small
        return self._order(ready)

    def _order(self, ready: list[Deployment]) -> list[Deployment]:
        strategy = self.options.strategy
        if strategy == "ordered" or len(ready) < 2:
            return ready
        if strategy == "weighted":  # a weighted random order (Efraimidis–Spirakis)
            rng = self._rng
            keyed = [(rng() ** (1.0 / max(d.options.weight, 1e-9)), d) for d in ready]
            return [d for _, d in sorted(keyed, key=lambda pair: -pair[0])]
        if strategy == "least_busy":
            busy = self.limiter.busy
            return sorted(ready, key=lambda d: busy(d.name))
        return sorted(ready, key=lambda d: d.latency_s)  # "latency": untried ones first

    def _unavailable(self, now: float) -> ProviderError:
        states = "; ".join(
            f"{d.name} cooling down for {max(0.0, d.breaker.until - now):.0f} s more "
            f"({d.breaker.reason})"
            for d in self.deployments
        )
        return ProviderError(self.key, f"no deployment is available: {states}", status=503)

    async def aclose(self) -> None:
        """Nothing of its own to close (the deployments' clients are the registry's)."""


@dataclass(slots=True)
class _Upstream:
    """One attempt on a deployment, open."""

    deployment: Deployment
    started: float
    stack: AsyncExitStack = field(default_factory=AsyncExitStack)
    reservation: Reservation | None = None
    deltas: AsyncIterator[ModelDelta] | None = None
    first_delta_s: float | None = None
    usage: Usage | None = None


class AliasCall:
    """One call of an alias: its attempts, as an async context manager of its deltas."""

    def __init__(
        self, alias: AliasClient, request: ModelRequest, plan: list[Deployment], tokens: int
    ) -> None:
        self.alias = alias
        self.request = request
        self.plan = plan
        self.tokens = tokens
        self.tried: list[Deployment] = []
        self.attempt: Attempt | None = None
        self.current: _Upstream | None = None
        self._relay: AsyncGenerator[ModelDelta, None] | None = None

    def announce(self, deployment: Deployment, *, reported: bool) -> Attempt:
        """The next attempt is on `deployment` (reported to the call's observer)."""
        self.tried.append(deployment)
        options = deployment.options
        number = self.attempt.number + 1 if self.attempt is not None else 1
        self.attempt = Attempt(number, options.name, options.provider, options.model)
        if reported and self.request.report is not None:
            self.request.report.attempt(self.attempt)
        return self.attempt

    async def __aenter__(self) -> AsyncIterator[ModelDelta]:
        try:
            first = await self._open()
        except BaseException as error:  # cancelled while an attempt was open: close it
            await self._end(error)
            raise
        self._relay = self._deltas(first)
        return self._relay

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        try:
            if self._relay is not None:
                await self._relay.aclose()
        finally:
            await self._end(error)

    async def _open(self) -> ModelDelta | None:
        """Try the announced attempt, then the next ones: the first delta of the first that
        gives one (None: it streamed nothing)."""
        while True:
            deployment = self.tried[-1]
            try:
                return await self._try(deployment)
            except Exception as error:
                failure = classify(error)
                following = self._next(failure, deployment) if failure is not None else None
                await self._end(error, failure)
                if following is None:
                    raise
                assert self.attempt is not None
                if self.request.report is not None:
                    self.request.report.attempt_failed(self.attempt, error)
                self.announce(following, reported=True)

    async def _try(self, deployment: Deployment) -> ModelDelta | None:
        alias = self.alias
        up = self.current = _Upstream(deployment, alias.clock())
        options = deployment.options
        up.reservation = await alias.limiter.reserve(options, self.tokens)
        deployment.breaker.begin(up.started)
        request = replace(self.request, provider=options.provider, model=options.model, report=None)
        up.deltas = await up.stack.enter_async_context(deployment.client.stream(request))
        first = await anext(up.deltas, None)
        up.first_delta_s = alias.clock() - up.started
        deployment.first_delta(up.first_delta_s)
        if first is not None and first.usage is not None:
            up.usage = first.usage
        return first

    def _next(self, failure: Failure, failed: Deployment) -> Deployment | None:
        """The deployment a call moves to after `failure` of `failed`, if any."""
        now = self.alias.clock()
        longer = failed.options.context_length
        for deployment in self.plan:
            if deployment in self.tried or not deployment.breaker.available(now):
                continue
            if failure is Failure.CONTEXT and deployment.options.context_length <= longer:
                continue
            return deployment
        return None

    async def _deltas(self, first: ModelDelta | None) -> AsyncGenerator[ModelDelta, None]:
        delta = first
        while True:
            up = self.current
            assert up is not None and up.deltas is not None
            try:
                if delta is not None:
                    yield delta
                async for delta in up.deltas:
                    if delta.usage is not None:
                        up.usage = delta.usage
                    yield delta
                return
            except ProviderError as error:
                failed = error
            failure = classify(failed)
            following = None
            if self.alias.options.restart_on_failure and failure is not None:
                following = self._next(failure, up.deployment)
            if following is None:
                raise failed
            await self._end(failed, failure)
            previous = self.attempt
            assert previous is not None
            yield ModelDelta(
                restart=Restart(previous, failed, self.announce(following, reported=False))
            )
            delta = await self._open()

    async def _end(self, error: BaseException | None, failure: Failure | None = None) -> None:
        """End the open attempt: close its stream, release it, judge its deployment."""
        up, self.current = self.current, None
        if up is None:
            return
        try:
            await up.stack.aclose()
        finally:
            await self._account(up, error, failure)

    async def _account(
        self, up: _Upstream, error: BaseException | None, failure: Failure | None
    ) -> None:
        alias, deployment = self.alias, up.deployment
        breaker = deployment.breaker
        if error is None:
            outcome = "ok"
            breaker.succeeded()
        elif isinstance(error, asyncio.CancelledError | GeneratorExit):
            outcome = "cancelled"
            breaker.ended()
        else:
            failure = failure if failure is not None else classify(error)
            outcome = failure.value if failure is not None else "error"
            if failure in COOLING:
                retry_after = getattr(error, "retry_after_s", None)
                breaker.failed(alias.clock(), str(error)[:300], retry_after)
            else:
                breaker.ended()
            if failure is not Failure.LIMITED:
                deployment.failures += 1
        if failure is not Failure.LIMITED:
            deployment.calls += 1
        usage = up.usage
        price = deployment.options.price
        cost = price.cost(usage) if price is not None and usage is not None else None
        seconds = alias.clock() - up.started
        metrics.attempt(
            alias.labels[deployment.name], outcome, seconds, up.first_delta_s, usage, cost
        )
        if up.reservation is not None:
            used = usage.total_tokens if usage is not None else None
            await alias.limiter.release(up.reservation, used)
