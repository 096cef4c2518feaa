"""The quota counters (in process, Redis) and the spend ledger (files, memory, PostgreSQL)
behave the same through their ports."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from service.core.ports import QuotaCounters, SpendLedger
from service.core.values import SpendEntry
from service.state import QUOTA_COUNTERS, SPEND_LEDGERS, StateOptions


def options(request: pytest.FixtureRequest, tmp_path: Path) -> StateOptions:
    extra: dict[str, str] = {}
    if request.param == "postgres":
        extra["postgres_dsn"] = request.getfixturevalue("postgres_dsn")
    if request.param == "redis":
        extra["redis_url"] = request.getfixturevalue("redis_url")
    return StateOptions(chats_dir=tmp_path / "chats", runs_dir=tmp_path / "runs", **extra)


@pytest.fixture(params=sorted(QUOTA_COUNTERS))
async def counters(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[QuotaCounters]:
    made = QUOTA_COUNTERS[request.param](options(request, tmp_path))
    await made.open()
    yield made
    await made.close()


@pytest.fixture(params=sorted(SPEND_LEDGERS))
async def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SpendLedger]:
    made = SPEND_LEDGERS[request.param](options(request, tmp_path))
    await made.open()
    yield made
    await made.close()


async def test_counters_add_up_and_expire(counters: QuotaCounters) -> None:
    assert await counters.value("c") == 0
    assert await counters.add("c", 5, 0.3) == 5
    assert await counters.add("c", 2, 60) == 7  # the first add set when it expires
    assert await counters.value("c") == 7
    await asyncio.sleep(0.4)
    assert await counters.value("c") == 0
    assert await counters.add("c", 1, 60) == 1


async def test_slots_are_taken_up_to_the_limit_given_back_and_expire(
    counters: QuotaCounters,
) -> None:
    assert await counters.take("s", "a", 2, 60)
    assert await counters.take("s", "b", 2, 0.3)
    assert not await counters.take("s", "c", 2, 60)
    await counters.give_back("s", "a")
    assert await counters.take("s", "c", 2, 60)
    await counters.renew("s", "b", 60)  # b lives on past its first time-to-live
    await asyncio.sleep(0.4)
    assert not await counters.take("s", "d", 2, 60)
    await counters.give_back("s", "b")
    assert await counters.take("s", "d", 2, 0.2)
    await asyncio.sleep(0.3)  # d expired unrenewed: its slot is free again
    assert await counters.take("s", "e", 2, 60)


async def test_the_ledger_adds_each_entry_to_its_row(ledger: SpendLedger) -> None:
    def entry(day: str, tenant: str, key: str, calls: int, cost: float) -> SpendEntry:
        return SpendEntry(day, tenant, key, "agent", "model-a", calls, 10 * calls, calls, cost)

    await ledger.add([entry("2026-05-01", "acme", "ci", 1, 0.25)])
    await ledger.add(
        [entry("2026-05-01", "acme", "ci", 2, 0.5), entry("2026-05-02", "acme", "", 1, 0.0)]
    )
    await ledger.add([entry("2026-05-02", "other", "x", 4, 1.0)])
    await ledger.add([])
    assert await ledger.read("acme", "2026-05-01", "2026-05-31") == [
        SpendEntry("2026-05-01", "acme", "ci", "agent", "model-a", 3, 30, 3, 0.75),
        SpendEntry("2026-05-02", "acme", "", "agent", "model-a", 1, 10, 1, 0.0),
    ]
    every = await ledger.read(None, "2026-05-02", "2026-05-02")
    assert [(r.tenant, r.calls) for r in every] == [("acme", 1), ("other", 4)]
    assert await ledger.read("acme", "2026-06-01", "2026-06-30") == []
