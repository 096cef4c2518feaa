"""The run registry and the mailbox against a real PostgreSQL: leases, fences, messages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from service.core.ids import ANONYMOUS, Principal
from service.state.pg_runs import Answer, Mailbox, RunRegistry
from service.state.pg_schema import Pool, close_pool, open_pool

ADA = Principal("acme", "ada")


@pytest.fixture
async def pool(postgres_dsn: str) -> AsyncIterator[Pool]:
    pool = await open_pool(postgres_dsn, max_size=4)
    yield pool
    await close_pool(pool)


@pytest.fixture
def registry(pool: Pool) -> RunRegistry:
    return RunRegistry(pool)


@pytest.fixture
def mailbox(pool: Pool) -> Mailbox:
    return Mailbox(pool)


async def test_a_run_is_registered_with_its_owner_and_one_running_run_per_chat(
    registry: RunRegistry,
) -> None:
    lease = await registry.start("r1", "c", ADA, "replica-a", 30.0)
    assert lease is not None and lease.run_id == "r1"
    entry = await registry.get("r1")
    assert entry is not None
    assert (entry.chat_id, entry.owner, entry.replica_id, entry.status, entry.terminal) == (
        "c",
        ADA,
        "replica-a",
        "running",
        None,
    )
    assert entry.fence == lease.fence and entry.lease_expires_at == lease.expires_at
    assert await registry.start("r2", "c", ADA, "replica-b", 30.0) is None  # chat busy
    assert await registry.start("r1", "other", ADA, "replica-b", 30.0) is None  # id taken
    running = await registry.running_of("c")
    assert running is not None and running.run_id == "r1"
    assert await registry.end("r1", lease.fence, b"terminal")
    assert await registry.running_of("c") is None
    second = await registry.start("r2", "c", ANONYMOUS, "replica-b", 30.0)
    assert second is not None and second.fence > lease.fence
    ended = await registry.get("r1")
    assert ended is not None and (ended.status, ended.terminal) == ("ended", b"terminal")
    assert await registry.get("r3") is None


async def test_the_owner_renews_its_lease_and_a_zombie_is_fenced_out(
    registry: RunRegistry,
) -> None:
    lease = await registry.start("r1", "c", ANONYMOUS, "replica-a", 0.2)
    assert lease is not None
    assert await registry.take_over("r1", "replica-b", 30.0) is None  # the lease is good
    renewed = await registry.renew("r1", lease.fence, 0.2)
    assert renewed is not None and renewed.fence == lease.fence
    assert renewed.expires_at >= lease.expires_at
    await asyncio.sleep(0.3)
    assert [e.run_id for e in await registry.expired()] == ["r1"]
    taken = await registry.take_over("r1", "replica-b", 30.0)
    assert taken is not None and taken.fence > lease.fence
    assert await registry.take_over("r1", "replica-c", 30.0) is None  # taken once only
    assert await registry.expired() == []
    # the old owner comes back: every fenced call changes nothing
    assert await registry.renew("r1", lease.fence, 30.0) is None
    assert not await registry.end("r1", lease.fence, b"zombie")
    entry = await registry.get("r1")
    assert entry is not None
    assert (entry.replica_id, entry.fence, entry.status) == ("replica-b", taken.fence, "running")
    assert await registry.end("r1", taken.fence, b"owner lost", status="lost")
    assert not await registry.end("r1", taken.fence, b"twice")
    assert await registry.take_over("r1", "replica-c", 30.0) is None  # no longer running
    entry = await registry.get("r1")
    assert entry is not None and (entry.status, entry.terminal) == ("lost", b"owner lost")


async def test_only_one_of_many_replicas_takes_over_an_expired_run(
    registry: RunRegistry,
) -> None:
    await registry.start("r1", "c", ANONYMOUS, "dead", 0.0)
    taken = await asyncio.gather(
        *(registry.take_over("r1", f"replica-{n}", 30.0) for n in range(8))
    )
    winners = [lease for lease in taken if lease is not None]
    assert len(winners) == 1
    entry = await registry.get("r1")
    assert entry is not None and entry.fence == winners[0].fence


async def test_ended_runs_are_forgotten_with_their_messages(
    registry: RunRegistry, mailbox: Mailbox
) -> None:
    old = await registry.start("old", "c1", ANONYMOUS, "a", 30.0)
    live = await registry.start("live", "c2", ANONYMOUS, "a", 30.0)
    assert old is not None and live is not None
    message = await mailbox.post("old", "cancel", {"reason": "user"})
    assert message is not None
    assert await registry.end("old", old.fence, b"t")
    assert await registry.forget(3600.0) == 0
    assert await registry.forget(0.0) == 1
    assert await registry.get("old") is None and await registry.get("live") is not None
    assert await mailbox.answer_of(message) is None


async def test_messages_are_taken_in_order_once_and_answered(
    registry: RunRegistry, mailbox: Mailbox
) -> None:
    lease = await registry.start("r1", "c", ADA, "replica-a", 30.0)
    assert lease is not None
    first = await mailbox.post("r1", "submit", {"toolId": "t1", "payload": {"ok": True}})
    second = await mailbox.post("r1", "cancel", {"reason": "user"})
    assert first is not None and second is not None and second > first
    assert await mailbox.post("no-such-run", "cancel", {}) is None
    assert await mailbox.take("r1", lease.fence + 1) == []  # not the owner's fence
    taken = await mailbox.take("r1", lease.fence)
    assert [(m.id, m.run_id, m.kind, m.payload) for m in taken] == [
        (first, "r1", "submit", {"toolId": "t1", "payload": {"ok": True}}),
        (second, "r1", "cancel", {"reason": "user"}),
    ]
    assert all(m.created_at > 0 for m in taken)
    assert await mailbox.take("r1", lease.fence) == []  # delivered once
    assert await mailbox.answer_of(first) is None
    assert not await mailbox.answer(first, lease.fence + 1, {"outcome": "ACCEPTED"})
    assert await mailbox.answer(first, lease.fence, {"outcome": "ACCEPTED", "detail": ""})
    assert not await mailbox.answer(first, lease.fence, {"outcome": "ALREADY_ANSWERED"})
    answer = await mailbox.answer_of(first)
    assert isinstance(answer, Answer)
    assert answer.value == {"outcome": "ACCEPTED", "detail": ""} and answer.answered_at > 0


async def test_a_run_that_ends_answers_what_is_left_and_takes_no_more(
    registry: RunRegistry, mailbox: Mailbox
) -> None:
    lease = await registry.start("r1", "c", ANONYMOUS, "replica-a", 30.0)
    assert lease is not None
    delivered = await mailbox.post("r1", "submit", {"toolId": "t1"})
    await mailbox.take("r1", lease.fence)
    waiting = await mailbox.post("r1", "submit", {"toolId": "t2"})
    answered = await mailbox.post("r1", "cancel", {})
    assert delivered and waiting and answered
    assert await mailbox.answer(answered, lease.fence, "cancelled")
    assert await registry.end("r1", lease.fence, b"t")
    assert await mailbox.post("r1", "cancel", {}) is None  # ended: nothing more is posted
    assert await mailbox.take("r1", lease.fence) == []
    gone = {"outcome": "UNKNOWN_RUN"}
    assert await mailbox.answer_all("r1", lease.fence + 1, gone) == []  # fenced
    assert await mailbox.answer_all("r1", lease.fence, gone) == [delivered, waiting]
    for message, value in ((delivered, gone), (waiting, gone), (answered, "cancelled")):
        answer = await mailbox.answer_of(message)
        assert answer is not None and answer.value == value


async def test_a_post_racing_the_end_of_its_run_is_answered_or_refused(
    registry: RunRegistry, mailbox: Mailbox
) -> None:
    for trial in range(20):
        run_id = f"r{trial}"
        lease = await registry.start(run_id, f"c{trial}", ANONYMOUS, "a", 30.0)
        assert lease is not None
        posts = [mailbox.post(run_id, "cancel", {"n": n}) for n in range(5)]
        results = await asyncio.gather(registry.end(run_id, lease.fence, b"t"), *posts)
        assert results[0] is True
        posted = sorted(m for m in results[1:] if m is not None)
        assert await mailbox.answer_all(run_id, lease.fence, "ended") == posted
