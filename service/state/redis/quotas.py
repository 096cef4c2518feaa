"""The Redis `QuotaCounters`: quota counters every replica shares (`AGW_RUN_BUS=redis`).

Keys live under `agw:quota:`. A counter is one integer (INCRBY), expiring a while after it
was made; the run slots of a scope are a sorted set whose scores are the slots' expiry
times, by Redis's own clock (`TIME`), so replicas whose clocks differ agree. Taking a slot
drops the expired ones, counts the rest and adds the new one in one script: two replicas
admitting at once never both take the last slot. A replica renews the slots of its runs
(the quotas do, every third of their time-to-live); the slots of a replica that died
expire.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from service.core.errors import BusUnavailable
from service.state.redis.link import UNREACHABLE

ADD = """
local value = redis.call('INCRBY', KEYS[1], ARGV[1])
if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return value
"""

TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[3]))
return 1
"""

RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[2]), ARGV[1]) == 1 then
  redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[2]))
end
return 0
"""


class RedisQuotaCounters:
    """Quota counters in Redis at `url`, shared by every replica that uses it."""

    def __init__(self, url: str, *, prefix: str = "agw:quota:", timeout_s: float = 5.0) -> None:
        self.prefix = prefix
        self.redis = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        self._add = self.redis.register_script(ADD)
        self._take = self.redis.register_script(TAKE)
        self._renew = self.redis.register_script(RENEW)

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        await self.redis.aclose()

    async def add(self, key: str, amount: int, ttl_s: float) -> int:
        try:
            return int(await self._add(keys=[self.prefix + key], args=[amount, _ms(ttl_s)]))
        except UNREACHABLE as error:
            raise _unreachable("count a quota", error) from error

    async def value(self, key: str) -> int:
        try:
            value = await self.redis.get(self.prefix + key)
        except UNREACHABLE as error:
            raise _unreachable("read a quota", error) from error
        return int(value) if value is not None else 0

    async def take(self, key: str, member: str, limit: int, ttl_s: float) -> bool:
        try:
            taken = await self._take(keys=[self.prefix + key], args=[member, limit, _ms(ttl_s)])
        except UNREACHABLE as error:
            raise _unreachable("take a run slot", error) from error
        return bool(taken)

    async def renew(self, key: str, member: str, ttl_s: float) -> None:
        await self._renew(keys=[self.prefix + key], args=[member, _ms(ttl_s)])

    async def give_back(self, key: str, member: str) -> None:
        await self.redis.zrem(self.prefix + key, member)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _unreachable(operation: str, error: BaseException) -> BusUnavailable:
    return BusUnavailable(
        f"the quotas' Redis is unreachable: {type(error).__name__}: {error}; retry",
        operation=operation,
    )
