"""Followers fed by pushes: a replica subscribes to a run's channel before reading its
stream, drops what it already has, and reads the stream again after a lost push (a gap in
the seqs) or a cut pub/sub connection (also one Redis cut for a full output buffer).

Two `RedisRunBus`es share the throwaway Redis: the owner, where the run is emitted
by hand, and the follower. Their leases are long, so that what a test sees is filled by
the pushes and the catch-ups, not by the check of runs that make no progress.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager

import pytest
import redis.asyncio as aioredis

from service.core import events
from service.core.events import Event
from service.core.run.eventlog import EventLog
from service.core.run.state import RunState
from service.state.redis import scripts
from service.state.redis.bus import RedisRunBus
from service.state.redis.mirror import Mirror
from tests.bus.conftest import eventually

LEASE_S = 60.0  # the check of stalled runs (a quarter of it) never comes within a test


def numbered(*texts: str, start: int = 1) -> list[Event]:
    """Content deltas with seqs from `start`."""
    made = []
    for seq, text in enumerate(texts, start):
        event = events.content_delta("c1", text)
        event.seq = seq
        made.append(event)
    return made


def test_a_mirror_drops_duplicates_and_keeps_what_comes_after_a_gap() -> None:
    mirror = Mirror("r1")
    assert not mirror.offer(numbered("a", "b"))  # pushed before the stream was read: kept
    assert not mirror.load(numbered("a", "b", "c"), done=False)  # duplicates dropped
    assert not mirror.offer(numbered("b", "c", "d", start=2))
    assert mirror.offer(numbered("f", "g", start=6))  # 5 was lost: a gap
    assert [e.seq for e in mirror.events] == [1, 2, 3, 4]
    assert [e.seq for e in mirror.ahead] == [6, 7]
    assert not mirror.extend(numbered("e", "f", start=5))  # read from the stream: filled
    assert [e.delta for e in (x.content_delta for x in mirror.events)] == list("abcdefg")
    assert mirror.ahead == []


def test_a_mirror_of_a_trimmed_stream_starts_where_the_stream_does() -> None:
    mirror = Mirror("r1")
    assert mirror.offer(numbered("x", start=9))  # before the first read: where is the start?
    assert not mirror.load(numbered("v", "w", start=7), done=False)
    assert (mirror.offset, [e.seq for e in mirror.events]) == (6, [7, 8, 9])


@asynccontextmanager
async def two_buses(redis_url: str) -> AsyncIterator[tuple[RedisRunBus, RedisRunBus]]:
    prefix = f"agw-test-{secrets.token_hex(3)}:"
    owner = RedisRunBus(redis_url, replica_id="owner", prefix=prefix, lease_ttl_s=LEASE_S)
    other = RedisRunBus(redis_url, replica_id="other", prefix=prefix, lease_ttl_s=LEASE_S)
    await owner.open()
    await other.open()
    try:
        yield owner, other
    finally:
        await other.close()
        await owner.close()


async def new_run(owner: RedisRunBus) -> RunState:
    run = RunState(EventLog(secrets.token_hex(8), "chat-1"), "test")
    assert await owner.register(run, new_chat=True) is None
    run.log.emit(events.run_start("test"))
    run.log.emit(events.content_start("c1"))
    return run


async def read_all(stream: AsyncGenerator[Event, None], timeout_s: float = 10.0) -> list[Event]:
    async with asyncio.timeout(timeout_s):
        return [event async for event in stream]


async def settle(owner: RedisRunBus, run: RunState) -> None:
    await owner.ended(run)
    await owner.settled(run)
    await owner.release(run.run_id)


async def test_the_channel_is_subscribed_before_the_stream_is_read(redis_url: str) -> None:
    admin = aioredis.Redis.from_url(redis_url)
    await admin.config_set("slowlog-log-slower-than", 0)  # every command, in order
    await admin.config_set("slowlog-max-len", 10000)
    try:
        async with two_buses(redis_url) as (owner, other):
            run = await new_run(owner)
            await admin.slowlog_reset()
            followed = await other.follow(run.run_id, 0)
            assert followed is not None
            commands = [entry["command"] for entry in reversed(await admin.slowlog_get(10000))]
            channel = owner.keys.channel(run.run_id).encode()
            stream = owner.keys.events(run.run_id).encode()
            subscribed = commands.index(b"SUBSCRIBE " + channel)
            read = next(n for n, c in enumerate(commands) if c.startswith(b"XRANGE " + stream))
            assert subscribed < read
            run.log.finish(events.run_complete("stop"))
            assert await read_all(followed) == list(run.log)
            await settle(owner, run)
    finally:
        await admin.config_set("slowlog-log-slower-than", 10000)
        await admin.config_set("slowlog-max-len", 128)
        await admin.aclose()


async def test_a_lost_push_is_read_from_the_stream(redis_url: str) -> None:
    """Events appended without reaching the follower's channel (as a lost push): the next
    push shows the gap, and the follower reads what it missed from the stream."""
    async with two_buses(redis_url) as (owner, other):
        run = await new_run(owner)
        followed = await other.follow(run.run_id, 0)
        assert followed is not None
        got = [await anext(followed), await anext(followed)]
        owner.suspend()  # the owner's appends wait
        run.log.emit(events.content_delta("c1", "lost "))
        run.log.emit(events.content_delta("c1", "lost too "))
        run.log.emit(events.content_delta("c1", "pushed"))
        lost = list(run.log)[2:4]
        args: list[object] = [1, 1000, run.run_id, "", 0, 0, "elsewhere"]  # another channel
        for event in lost:
            args += [event.seq, event.SerializeToString()]
        appended = await owner.redis.eval(
            scripts.APPEND, 6, *owner.keys.appending(run.run_id, "chat-1"), *args
        )
        assert appended == 1
        owner.resume()  # appends 3..5: 3 and 4 are there, 5 is pushed alone
        async with asyncio.timeout(5.0):
            while len(got) < 5:
                got.append(await anext(followed))
        run.log.finish(events.run_complete("stop"))
        got += await read_all(followed)
        assert got == list(run.log)
        await settle(owner, run)


async def test_a_cut_pubsub_connection_is_made_again_and_what_it_missed_read(
    redis_url: str,
) -> None:
    admin = aioredis.Redis.from_url(redis_url)
    try:
        async with two_buses(redis_url) as (owner, other):
            run = await new_run(owner)
            followed = await other.follow(run.run_id, 0)
            assert followed is not None
            got = [await anext(followed), await anext(followed)]
            assert await admin.client_kill_filter(_type="pubsub") == 1
            for n in range(5):  # appended while the follower is not subscribed
                run.log.emit(events.content_delta("c1", f"{n} "))
            async with asyncio.timeout(5.0):
                while len(got) < 7:
                    got.append(await anext(followed))
            run.log.emit(events.content_delta("c1", "after"))  # pushed again
            run.log.finish(events.run_complete("stop"))
            got += await read_all(followed, 5.0)
            assert got == list(run.log)
            await settle(owner, run)
    finally:
        await admin.aclose()


async def test_a_follower_cut_for_a_full_output_buffer_gets_every_event_once(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    admin = aioredis.Redis.from_url(redis_url)
    await admin.config_set("client-output-buffer-limit", "pubsub 1 0 0")  # any backlog
    try:
        async with two_buses(redis_url) as (owner, other):
            run = await new_run(owner)
            followed = await other.follow(run.run_id, 0)
            assert followed is not None
            for n in range(6):  # each push larger than Redis's fixed reply buffer
                run.log.emit(events.content_delta("c1", f"{n}" * 40_000))
                await asyncio.sleep(0.01)
            run.log.finish(events.run_complete("stop"))
            assert await read_all(followed) == list(run.log)
            assert any("pub/sub connection was cut" in r.message for r in caplog.records)
            await settle(owner, run)
    finally:
        await admin.config_set("client-output-buffer-limit", "pubsub 33554432 8388608 60")
        await admin.aclose()


async def test_a_channel_is_unsubscribed_once_its_run_ended(redis_url: str) -> None:
    async with two_buses(redis_url) as (owner, other):
        run = await new_run(owner)
        channel = owner.keys.channel(run.run_id)

        async def subscribers() -> int:
            counts = await owner.redis.pubsub_numsub(channel)
            return int(counts[0][1])

        followed = await other.follow(run.run_id, 0)
        assert followed is not None
        assert await subscribers() == 1
        run.log.finish(events.run_complete("stop"))
        assert await read_all(followed) == list(run.log)

        async def unsubscribed() -> bool:
            return await subscribers() == 0

        await eventually(unsubscribed)
        await settle(owner, run)
