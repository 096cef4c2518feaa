"""Rate limits and calls in flight shared by the replicas, in Redis (the `Limiter` port).

Per deployment, under a prefix: the calls and the tokens of the current minute (two
counters that expire with it) and the calls in flight (a sorted set of call ids scored
by when they are forgotten, so that a replica that dies leaks nothing for long). A
reservation is one script, atomic across replicas: it checks both limits, counts the
call and its estimated tokens, adds the call in flight and answers the deployment's
calls in flight. A release removes the call and corrects the tokens by what it really
used; it runs in a task of its own, so that a cancelled call still releases.

Only calls do I/O here, never deltas: one round trip to reserve, one (not awaited by
the call) to release. The least-busy strategy reads the counts of calls in flight from
memory: each reservation brings its deployment's count back, and a task refreshes every
deployment's count each `refresh_s` (one pipelined round trip), so that a replica sees
the others' calls within that time.

Redis unreachable: the call goes on as if unlimited (a warning is logged), counted in
this process only — a limiter outage does not take the models down.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Iterable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from service.providers.routing.deployment import DeploymentOptions
from service.providers.routing.limits import (
    WINDOW_S,
    LocalLimiter,
    Reservation,
    Usage,
    limit_reached,
)

log = logging.getLogger("agw.routing")

#: How long a call stays counted in flight if its replica never releases it.
FORGET_AFTER_S = 15 * 60

# KEYS: calls, tokens (this minute), in flight. ARGV: rpm, tpm, tokens, call, now_ms, forget_ms
RESERVE = """
local calls = tonumber(redis.call('GET', KEYS[1]) or '0')
local tokens = tonumber(redis.call('GET', KEYS[2]) or '0')
local rpm, tpm, asked = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if rpm > 0 and calls >= rpm then return {0, 'rpm'} end
if tpm > 0 and tokens > 0 and tokens + asked > tpm then return {0, 'tpm'} end
redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], 120000)
redis.call('INCRBY', KEYS[2], asked)
redis.call('PEXPIRE', KEYS[2], 120000)
local now = tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[6]), ARGV[4])
redis.call('PEXPIRE', KEYS[3], ARGV[6])
return {1, redis.call('ZCARD', KEYS[3])}
"""


class RedisLimiter:
    """The deployments' limits, shared by every replica using the same Redis and prefix."""

    shared = True

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "agw:route:",
        timeout_s: float = 2.0,
        refresh_s: float = 0.5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.refresh_s = refresh_s
        self._clock = clock
        self.redis = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._reserve = self.redis.register_script(RESERVE)
        self._busy: dict[str, int] = {}  # deployment -> calls in flight, as last known
        self._known: set[str] = set()
        self._refreshing: asyncio.Task[None] | None = None  # the refresh loop, once started
        self._tasks: set[asyncio.Task[None]] = set()
        self._fallback = LocalLimiter(clock)  # while Redis cannot be reached

    def _keys(self, name: str, window: int) -> list[str]:
        p = self.prefix
        return [f"{p}calls:{name}:{window}", f"{p}tokens:{name}:{window}", f"{p}busy:{name}"]

    def track(self, deployments: Iterable[str]) -> None:
        """Keep the counts of calls in flight of these deployments fresh."""
        self._known.update(deployments)

    async def reserve(self, deployment: DeploymentOptions, tokens: int) -> Reservation:
        name = deployment.name
        self._known.add(name)
        now = self._clock()
        window = int(now // WINDOW_S)
        call_id = secrets.token_hex(8)
        args: list[str | int] = [deployment.rpm, deployment.tpm, tokens, call_id]
        args += [int(now * 1000), FORGET_AFTER_S * 1000]
        try:
            async with asyncio.timeout(self.timeout_s):
                ok, value = await self._reserve(keys=self._keys(name, window), args=args)
        except (RedisError, OSError, TimeoutError) as error:
            log.warning("routing: Redis unreachable (%s); %s counted here only", error, name)
            return await self._fallback.reserve(deployment, tokens)
        if not ok:
            raise limit_reached(deployment, value.decode() if isinstance(value, bytes) else value)
        self._busy[name] = int(value)
        return Reservation(deployment, tokens, window, call_id)

    async def release(self, reservation: Reservation, tokens: int | None) -> None:
        if not reservation.call_id:  # reserved while Redis was unreachable
            await self._fallback.release(reservation, tokens)
            return
        name = reservation.deployment.name
        self._busy[name] = max(0, self._busy.get(name, 0) - 1)
        task = asyncio.get_running_loop().create_task(self._release(reservation, tokens))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _release(self, reservation: Reservation, tokens: int | None) -> None:
        _, used, busy = self._keys(reservation.deployment.name, reservation.window)
        try:
            async with asyncio.timeout(self.timeout_s), self.redis.pipeline() as pipe:
                pipe.zrem(busy, reservation.call_id)
                if tokens is not None and tokens != reservation.tokens:
                    pipe.incrby(used, tokens - reservation.tokens)
                await pipe.execute()
        except (RedisError, OSError, TimeoutError) as error:
            log.warning("routing: a release was lost, Redis unreachable (%s)", error)

    def busy(self, deployment: str) -> int:
        self._keep_fresh()  # (called by a call's plan: in the running loop)
        return self._busy.get(deployment, 0) + self._fallback.busy(deployment)

    def _keep_fresh(self) -> None:
        """Start refreshing the counts of the tracked deployments (once, in the running loop:
        from the first call, or the first status asked)."""
        if self._refreshing is None and self._known:
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh())

    async def _refresh(self) -> None:
        """Every `refresh_s`: the calls in flight of every known deployment."""
        while True:
            names = sorted(self._known)
            now_ms = int(self._clock() * 1000)
            try:
                async with asyncio.timeout(self.timeout_s), self.redis.pipeline() as pipe:
                    for name in names:
                        pipe.zcount(self._keys(name, 0)[2], now_ms, "+inf")
                    counts = await pipe.execute()
                self._busy.update(zip(names, (int(c) for c in counts), strict=True))
            except (RedisError, OSError, TimeoutError) as error:
                log.warning("routing: counts of calls in flight not refreshed (%s)", error)
            await asyncio.sleep(self.refresh_s)

    async def usage(self, deployment: DeploymentOptions) -> Usage:
        self._keep_fresh()
        name = deployment.name
        now = self._clock()
        calls, tokens, busy = self._keys(name, int(now // WINDOW_S))
        try:
            async with asyncio.timeout(self.timeout_s), self.redis.pipeline() as pipe:
                pipe.get(calls)
                pipe.get(tokens)
                pipe.zcount(busy, int(now * 1000), "+inf")
                made, used, flying = await pipe.execute()
        except (RedisError, OSError, TimeoutError):
            return await self._fallback.usage(deployment)
        return Usage(int(flying), int(made or 0), max(0, int(used or 0)))

    async def aclose(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            await asyncio.wait([self._refreshing])
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.timeout_s)
        await self.redis.aclose()
