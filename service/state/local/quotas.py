"""The in-process `QuotaCounters` and `SpendLedger`: for one process; nothing survives it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from service.core.values import SpendEntry


class LocalQuotaCounters:
    """Counters and sets of run slots in dicts, expiring by the monotonic clock."""

    def __init__(self) -> None:
        self._counters: dict[str, tuple[int, float]] = {}  # key -> (value, expires at)
        self._sets: dict[str, dict[str, float]] = {}  # key -> member -> expires at

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def _live(self, key: str, now: float) -> tuple[int, float] | None:
        kept = self._counters.get(key)
        if kept is not None and kept[1] <= now:
            del self._counters[key]
            return None
        return kept

    async def add(self, key: str, amount: int, ttl_s: float) -> int:
        now = time.monotonic()
        for stale in [k for k, (_, until) in self._counters.items() if until <= now]:
            del self._counters[stale]
        value, until = self._live(key, now) or (0, now + ttl_s)
        self._counters[key] = (value + amount, until)
        return value + amount

    async def value(self, key: str) -> int:
        kept = self._live(key, time.monotonic())
        return kept[0] if kept is not None else 0

    async def take(self, key: str, member: str, limit: int, ttl_s: float) -> bool:
        now = time.monotonic()
        members = {m: until for m, until in self._sets.get(key, {}).items() if until > now}
        self._sets[key] = members
        if len(members) >= limit:
            return False
        members[member] = now + ttl_s
        return True

    async def renew(self, key: str, member: str, ttl_s: float) -> None:
        members = self._sets.get(key, {})
        if member in members:
            members[member] = time.monotonic() + ttl_s

    async def give_back(self, key: str, member: str) -> None:
        self._sets.get(key, {}).pop(member, None)


class LocalSpendLedger:
    """The spend ledger in a dict."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str, str, str, str], SpendEntry] = {}

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def add(self, entries: Sequence[SpendEntry]) -> None:
        for entry in entries:
            row = self._rows.get(entry.where)
            self._rows[entry.where] = entry if row is None else add_to(row, entry)

    async def read(self, tenant: str | None, first_day: str, last_day: str) -> list[SpendEntry]:
        return [
            row
            for where, row in sorted(self._rows.items())
            if first_day <= row.day <= last_day and (tenant is None or row.tenant == tenant)
        ]


def add_to(row: SpendEntry, more: SpendEntry) -> SpendEntry:
    """`row` with the amounts of `more` added."""
    return replace(
        row,
        calls=row.calls + more.calls,
        prompt_tokens=row.prompt_tokens + more.prompt_tokens,
        completion_tokens=row.completion_tokens + more.completion_tokens,
        cost=row.cost + more.cost,
    )
