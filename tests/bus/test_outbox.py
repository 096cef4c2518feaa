"""The owner's outbox: one loop tick's events of every run in one write, and writes that
fail (the connection cut while answers are awaited) sent again without a gap or a
duplicate for any follower.

Two `RedisRunBus`es share the throwaway Redis (as in `test_pushed.py`): the owner, where
runs are emitted by hand, and a follower on another replica, reading each run through
Redis. Redis's own counters (`INFO commandstats`) tell how many writes the owner made.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

import pytest
import redis.asyncio as aioredis

from service.core import events
from service.core.events import Event
from service.core.run.eventlog import EventLog
from service.core.run.state import RunState
from service.state.redis.bus import RedisRunBus
from tests.bus.test_pushed import read_all, settle, two_buses

RUNS = 4


async def new_run(owner: RedisRunBus) -> RunState:
    """A run of a chat of its own, started."""
    run = RunState(EventLog(secrets.token_hex(8), f"chat-{secrets.token_hex(4)}"), "test")
    assert await owner.register(run, new_chat=True) is None
    run.log.emit(events.run_start("test"))
    run.log.emit(events.content_start("c1"))
    return run


async def script_calls(admin: aioredis.Redis) -> int:
    """How many EVALSHA calls Redis has executed so far."""
    stats = await admin.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def read_some(followed: object, count: int, timeout_s: float = 5.0) -> list[Event]:
    got: list[Event] = []
    async with asyncio.timeout(timeout_s):
        while len(got) < count:
            got.append(await anext(followed))  # type: ignore[call-overload]
    return got


async def test_one_tick_of_several_runs_is_one_write_and_each_follower_gets_its_run_in_order(
    redis_url: str,
) -> None:
    admin = aioredis.Redis.from_url(redis_url)
    try:
        async with two_buses(redis_url) as (owner, other):
            runs: list[RunState] = [await new_run(owner) for _ in range(RUNS)]
            followed = []
            for run in runs:
                stream = await other.follow(run.run_id, 0)
                assert stream is not None
                followed.append(stream)
            got = [await read_some(stream, 2) for stream in followed]  # run.start, content.start
            before = await script_calls(admin)
            for n in range(3):  # one tick: every run's deltas, interleaved
                for run in runs:
                    run.log.emit(events.content_delta("c1", f"{run.run_id[:4]} {n} "))
            for stream, seen in zip(followed, got, strict=True):
                seen += await read_some(stream, 3)
            assert await script_calls(admin) - before == 1  # one call carried all 12 events
            for run in runs:  # the ends, in one tick too
                run.log.finish(events.run_complete("stop"))
            for run, stream, seen in zip(runs, followed, got, strict=True):
                seen += await read_all(stream)
                assert seen == list(run.log)  # each run's events, once, in seq order
            for run in runs:
                await settle(owner, run)
    finally:
        await admin.aclose()


async def test_a_connection_cut_with_writes_unanswered_loses_and_repeats_nothing(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Writes of several ticks sent, not executed yet (Redis paused for writes), when the
    outbox's connection is cut: they are sent again on a new one, from each run's first
    event not known appended; what Redis executed anyway is skipped."""
    caplog.set_level(logging.INFO, "agw.bus")
    admin = aioredis.Redis.from_url(redis_url)
    try:
        async with two_buses(redis_url) as (owner, other):
            runs = [await new_run(owner) for _ in range(RUNS)]
            followed = []
            for run in runs:
                stream = await other.follow(run.run_id, 0)
                assert stream is not None
                followed.append(stream)
            got = [await read_some(stream, 2) for stream in followed]
            await admin.execute_command("CLIENT", "PAUSE", 400, "WRITE")
            for n in range(5):  # five ticks, five writes under way
                for run in runs:
                    run.log.emit(events.content_delta("c1", f"{n} "))
                await asyncio.sleep(0.01)
            name = f"{owner.keys.prefix}outbox:owner"
            (outbox,) = [c for c in await admin.client_list() if c["name"] == name]
            assert await admin.client_kill_filter(_id=outbox["id"]) == 1
            await admin.execute_command("CLIENT", "UNPAUSE")
            for run in runs:  # and more, on the new connection
                run.log.emit(events.content_delta("c1", "after"))
                run.log.finish(events.run_complete("stop"))
            for run, stream, seen in zip(runs, followed, got, strict=True):
                seen += await read_all(stream)
                assert seen == list(run.log)  # every event once, in seq order
            assert any("cannot publish events" in r.message for r in caplog.records)
            for run in runs:
                await settle(owner, run)
    finally:
        await admin.execute_command("CLIENT", "UNPAUSE")
        await admin.aclose()


async def test_a_long_backlog_goes_in_several_writes_in_order(redis_url: str) -> None:
    """More events of a run than one write carries (`MAX_BATCH`): the writes follow one
    another without waiting for answers, and the follower gets them all in order."""
    async with two_buses(redis_url) as (owner, other):
        run = await new_run(owner)
        stream = await other.follow(run.run_id, 0)
        assert stream is not None
        for n in range(700):
            run.log.emit(events.content_delta("c1", f"{n} "))
        run.log.finish(events.run_complete("stop"))
        assert await read_all(stream) == list(run.log)
        await settle(owner, run)
