"""EventLog.relay: the events after a seq, handed to `send` one at a time."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Sequence

import pytest

from service.core import events
from service.core.events import Event
from service.core.run.eventlog import EventLog
from service.core.run.journal import JournalEntry, Journaling


async def _relayed(log: EventLog, after_seq: int, started: asyncio.Event) -> list[int]:
    seen: list[int] = []

    async def send(event: Event) -> None:
        seen.append(event.seq)
        await asyncio.sleep(0)  # a write that suspends, as a gRPC write does

    started.set()
    await log.relay(after_seq, send)
    return seen


async def test_relay_from_every_seq_while_live_has_no_gap_and_no_duplicate() -> None:
    log = EventLog("run-1", "chat-1")
    scope = log.scope()
    scope.emit(events.content_start("run-1_c_1"))
    readers: list[asyncio.Task[list[int]]] = []
    for n in range(5):
        started = asyncio.Event()
        readers.append(asyncio.create_task(_relayed(log, len(log), started)))
        await started.wait()
        assert log.subscribers == n + 1
        scope.emit(events.content_delta("run-1_c_1", f"d{n}"))
        await asyncio.sleep(0)
    log.finish(events.make("run_complete"))
    results = await asyncio.gather(*readers)
    total = len(log)
    assert [e.WhichOneof("payload") for e in log][-2:] == ["content_end", "run_complete"]
    for n, seen in enumerate(results):
        assert seen == list(range(n + 2, total + 1))
    assert log.subscribers == 0


async def test_relay_failing_send_leaves_and_reports_the_last_reader_leaving() -> None:
    log = EventLog("run-2", "chat-2")
    left: list[EventLog] = []
    log.on_unwatched = left.append
    log.scope().emit(events.content_start("run-2_c_1"))
    log.scope().emit(events.content_delta("run-2_c_1", "a"))

    async def send(event: Event) -> None:
        if event.seq == 3:
            raise RuntimeError("the client went away")

    relay = asyncio.create_task(log.relay(0, send))
    await asyncio.sleep(0)
    log.scope().emit(events.content_delta("run-2_c_1", "b"))
    with pytest.raises(RuntimeError, match="went away"):
        await relay
    assert left == [log]  # the run is live and nobody follows it any more
    assert log.subscribers == 0


class _Journal:
    async def write(self, entries: Sequence[JournalEntry]) -> None:
        return None

    def write_now(self, entries: Sequence[JournalEntry]) -> bool:
        return True


def _alive(run_id: str) -> list[Event]:
    """The parsed events of `run_id` still alive."""
    return [o for o in gc.get_objects() if type(o) is Event and o.run_id == run_id]


async def test_a_journaled_runs_waiting_reader_leaves_no_event_held_parsed() -> None:
    """While its only reader waits, the run holds what it read as the journal's bytes only:
    neither the reader (its last event) nor the open block (its start) keeps one parsed.
    The block's start is read back from its bytes to close it."""
    journaling = Journaling(_Journal())
    log = EventLog("run-3", "chat-3", journaling=journaling)
    log.scope().emit(events.content_start("run-3_c_1"))
    log.scope().emit(events.content_delta("run-3_c_1", "a"))
    await journaling.flush()
    seen: list[int] = []

    async def send(event: Event) -> None:
        seen.append(event.seq)
        await asyncio.sleep(0)

    relay = asyncio.create_task(log.relay(0, send))
    async with asyncio.timeout(5):
        while len(seen) < 2 or not log._waiters:  # noqa: ASYNC110 (the reader waits)
            await asyncio.sleep(0.001)
    assert _alive("run-3") == []
    assert [e.content_start.content_id for e in log.open_blocks] == ["run-3_c_1"]
    log.finish(events.make("run_complete"))
    await journaling.flush()
    await asyncio.wait_for(relay, 5)
    kinds = ["content.start", "content.delta", "content.end", "run.complete"]
    assert [e.type for e in log] == kinds
    assert seen == [1, 2, 3, 4] and log.open_blocks == []
