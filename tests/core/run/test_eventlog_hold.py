"""EventLog.hold / release (a new run's opening waits for its first model request) and
hand_on (a turn's first output is written out before its producer goes on)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from service.core import events
from service.core.events import Event
from service.core.run import eventlog
from service.core.run.eventlog import EventLog
from service.core.run.journal import JournalEntry, Journaling, RunSteps


class Writer:
    """A journal that writes every batch at once, and keeps them."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, str]]] = []

    async def write(self, entries: Sequence[JournalEntry]) -> None:
        self.write_now(entries)

    def write_now(self, entries: Sequence[JournalEntry]) -> bool:
        self.batches.append([(e.kind, e.key) for e in entries])
        return True


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def reader(log: EventLog, seen: list[str]) -> asyncio.Task[None]:
    async def send(event: Event) -> None:
        seen.append(event.type)

    return asyncio.create_task(log.relay(0, send))


async def test_a_held_journaled_log_gives_its_journal_and_readers_nothing_until_released() -> None:
    writer = Writer()
    journaling = Journaling(writer)
    log = EventLog("run-1", "chat-1", journaling=journaling)
    log.steps = RunSteps("run-1", journaling)
    seen: list[str] = []
    following = reader(log, seen)
    log.hold()
    out = log.scope()
    out.emit(events.run_start("agent"))
    log.steps.hand_over("drain")  # a step's entry, submitted while held: kept in order
    out.emit(events.content_start("run-1_c_1"))
    await turns()
    assert (writer.batches, seen, log.visible) == ([], [], 0)
    journaling.submit(JournalEntry("run-1", "begin", "chat-1"))  # what the release comes after
    log.release()
    await turns()
    assert writer.batches == [
        [("begin", "chat-1"), ("event", "1"), ("step", "handover 0"), ("event", "2")]
    ]
    assert seen == ["run.start", "content.start"]
    assert log.journaling is journaling and log.steps.journaling is journaling
    out.emit(events.content_delta("run-1_c_1", "x"))  # no longer held
    await turns()
    assert writer.batches[-1] == [("event", "3")]
    assert seen[-1] == "content.delta"
    log.finish(events.make("run_complete"))
    await asyncio.wait_for(following, 1.0)
    await asyncio.wait_for(log.published(), 1.0)


async def test_a_held_unjournaled_log_shows_everything_once_released() -> None:
    log = EventLog("run-2", "chat-2")
    seen: list[str] = []
    following = reader(log, seen)
    log.hold()
    out = log.scope()
    out.emit(events.run_start("agent"))
    log.finish(events.make("run_complete"))  # the run may even end before the release
    published = asyncio.create_task(log.published())
    await turns()
    assert (seen, log.visible, published.done()) == ([], 0, False)
    log.release()
    await asyncio.wait_for(following, 1.0)
    await asyncio.wait_for(published, 1.0)
    assert seen == ["run.start", "run.complete"]
    assert log.visible == 2


async def test_a_held_logs_opening_comes_at_the_release_or_before_anything_else() -> None:
    log = EventLog("run-6", "chat-6", journaling=Journaling(Writer()))
    log.hold([events.run_start("agent")])
    assert len(log) == 0
    log.release()
    assert [e.type for e in log] == ["run.start"]

    early = EventLog("run-7", "chat-7")
    early.hold([events.chat_start("Hi"), events.run_start("agent")])
    early.scope().emit(events.content_start("run-7_c_1"))  # before the release: after them
    assert [e.type for e in early] == ["chat.start", "run.start", "content.start"]
    early.release()
    assert [e.seq for e in early] == [1, 2, 3]


async def test_hand_on_returns_once_the_readers_have_written_what_was_emitted() -> None:
    log = EventLog("run-3", "chat-3", journaling=Journaling(Writer()))
    written: list[str] = []

    async def slow_send(event: Event) -> None:
        await asyncio.sleep(0.001)  # a write that takes a while
        written.append(event.type)

    following = asyncio.create_task(log.relay(0, slow_send))
    await turns()
    out = log.scope()
    out.emit(events.content_start("run-3_c_1"))
    out.emit(events.content_delta("run-3_c_1", "first"))
    await log.hand_on()
    assert written == ["content.start", "content.delta"]
    log.finish(events.make("run_complete"))
    await asyncio.wait_for(following, 1.0)


async def test_hand_on_shows_what_was_emitted_without_waiting_for_the_loop_turns_end() -> None:
    writer = Writer()
    log = EventLog("run-6", "chat-6", journaling=Journaling(writer))
    following = reader(log, [])
    await turns()
    seen_by_next: list[int] = []
    asyncio.get_running_loop().call_soon(lambda: seen_by_next.append(log.visible))
    out = log.scope()
    out.emit(events.content_start("run-6_c_1"))
    out.emit(events.content_delta("run-6_c_1", "first"))
    assert log.visible == 0  # journaled at the end of the loop turn, as a rule
    await log.hand_on()
    # shown before what was due next in the loop ran, not at the end of its turn
    assert seen_by_next == [2] and writer.batches == [[("event", "1"), ("event", "2")]]
    log.finish(events.make("run_complete"))
    await asyncio.wait_for(following, 1.0)


async def test_hand_on_does_not_wait_for_a_stuck_reader_longer_than_its_bound() -> None:
    log = EventLog("run-4", "chat-4")
    stuck = asyncio.Event()

    async def send(_event: Event) -> None:
        await stuck.wait()  # a client that does not read

    following = asyncio.create_task(log.relay(0, send))
    await turns()
    log.scope().emit(events.content_start("run-4_c_1"))
    started = time.monotonic()
    await log.hand_on()
    assert eventlog.HAND_ON_S <= time.monotonic() - started < eventlog.HAND_ON_S + 0.5
    assert log._handing is None
    following.cancel()
    await asyncio.gather(following, return_exceptions=True)


async def test_hand_on_without_a_reader_returns_at_once() -> None:
    log = EventLog("run-5", "chat-5", journaling=Journaling(Writer()))
    log.scope().emit(events.content_start("run-5_c_1"))
    other = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(other.set_result, None)
    await log.hand_on()
    assert not other.done()  # it did not even let the loop turn
    await other
