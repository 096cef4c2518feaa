"""Every run journal keeps what a run journaled, in order, until its end (the same through the
port, whatever keeps it), and the files one keeps it across a restart of its process."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from service.core import events
from service.core.ports import RunJournal
from service.core.run.journal import DRAIN, PARK, JournalEntry, entries_of, handover_key
from service.state import RUN_JOURNALS
from tests.state.test_ports import options

BACKENDS = sorted(name for name in RUN_JOURNALS if name != "none")


def numbered(*made: events.Event) -> list[events.Event]:
    for seq, event in enumerate(made, 1):
        event.seq, event.run_id, event.chat_id = seq, "r1", "c1"
        event.type = events.EVENT_TYPES[event.WhichOneof("payload") or ""]
    return list(made)


@pytest.fixture(params=BACKENDS)
async def journal(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[RunJournal]:
    made = RUN_JOURNALS[request.param](options(request, tmp_path))
    assert made is not None
    await made.open()
    yield made
    await made.close()


def begin(run_id: str, chat_id: str = "c1") -> JournalEntry:
    return JournalEntry(run_id, "begin", chat_id, json.dumps({"agentKey": "a"}).encode())


def step(run_id: str, key: str, result: object, attempt: int = 0) -> JournalEntry:
    return JournalEntry(run_id, "step", key, json.dumps(result).encode(), attempt)


async def test_a_run_is_kept_as_journaled_until_its_end(journal: RunJournal) -> None:
    logged = numbered(events.run_start("a"), events.content_start("c_1"))
    await journal.write([begin("r1"), *entries_of("r1", logged[:1])])
    await journal.write(
        [
            JournalEntry("r1", "start", "turn 1"),
            *entries_of("r1", logged[1:]),
            step("r1", "turn 1", {"text": "hi"}),
            JournalEntry("r1", "start", "task task_1/tool t1"),
        ]
    )
    await journal.write([begin("r2", "c2"), JournalEntry("r1", "resume", "2", attempt=2)])
    assert await journal.unfinished() == ["r1", "r2"]
    kept = await journal.load("r1")
    assert kept is not None
    assert (kept.run_id, kept.chat_id, kept.record, kept.attempts) == (
        "r1",
        "c1",
        {"agentKey": "a"},
        2,
    )
    assert kept.events == logged
    assert kept.steps == {"turn 1": {"text": "hi"}}
    assert kept.started == {"task task_1/tool t1"}
    assert not kept.ended
    # The owner the run was taken from (attempt 0, still running somewhere) is not kept;
    # the run's owner now (attempt 2) is.
    await journal.write([step("r1", "turn 2", "stale"), JournalEntry("r1", "end")])
    await journal.write([step("r1", "task task_1/tool t1", [True, 7], attempt=2)])
    again = await journal.load("r1")
    assert again is not None and again.started == set()
    assert list(again.steps) == ["turn 1", "task task_1/tool t1"]  # in the order journaled
    await journal.write([JournalEntry("r1", "end", attempt=2)])
    assert await journal.load("r1") is None
    assert await journal.unfinished() == ["r2"]


async def test_the_files_journal_outlives_its_process(tmp_path: Path) -> None:
    from service.state.files.journal import FileRunJournal

    first = FileRunJournal(tmp_path)
    await first.open()
    logged = numbered(events.run_start("a"))
    await first.write([begin("r1"), *entries_of("r1", logged), step("r1", "turn 1", 1)])
    await first.close()
    second = FileRunJournal(tmp_path)
    await second.open()
    try:
        kept = await second.load("r1")
        assert kept is not None and kept.events == logged and kept.steps == {"turn 1": 1}
        await second.write([step("r1", "turn 2", 2)])
        again = await second.load("r1")
        assert again is not None and list(again.steps) == ["turn 1", "turn 2"]
    finally:
        await second.close()


async def test_a_run_handed_over_or_parked_is_not_counted_lost(journal: RunJournal) -> None:
    """Of its owners, only those that stopped without handing the run over were lost; the
    last one parked it when its hand-over says so."""
    await journal.write([begin("r1"), step("r1", handover_key(0), {"reason": DRAIN})])
    await journal.write([JournalEntry("r1", "resume", "1", attempt=1)])
    await journal.write([JournalEntry("r1", "resume", "2", attempt=2)])  # owner 1 was lost
    kept = await journal.load("r1")
    assert kept is not None and (kept.attempts, kept.losses, kept.parked) == (2, 2, False)
    await journal.write([step("r1", handover_key(2), {"reason": PARK}, attempt=2)])
    kept = await journal.load("r1")
    assert kept is not None and (kept.losses, kept.parked) == (1, True)
    await journal.write([JournalEntry("r1", "resume", "3", attempt=3)])  # woken
    kept = await journal.load("r1")
    assert kept is not None and (kept.losses, kept.parked) == (2, False)
