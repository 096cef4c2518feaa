"""Every run journal keeps what a run journaled, in order, until its end (the same through the
port, whatever keeps it), and the files one keeps it across a restart of its process."""

from __future__ import annotations

import asyncio
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
    # the run's owner now (attempt 2) is — events alone in a batch as well.
    await journal.write([step("r1", "turn 2", "stale"), JournalEntry("r1", "end")])
    await journal.write([step("r1", "task task_1/tool t1", [True, 7], attempt=2)])
    later = numbered(*logged, events.content_delta("c_1", "stale"), events.content_end("c_1"))
    await journal.write(entries_of("r1", later[2:3]))  # attempt 0: stale
    await journal.write([e._replace(attempt=2) for e in entries_of("r1", later[3:])])
    again = await journal.load("r1")
    assert again is not None and again.started == set()
    assert again.events == [*logged, later[3]]
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


async def test_the_files_journal_commits_on_the_loop_and_hands_the_thread_what_would_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch is written at once on the event loop: its events appended to their segment,
    its steps committed; unless another connection holds the write lock and the batch has
    more than events: then `write_now` writes nothing and says so, and the batch is
    written by the thread (waiting for the lock) — in order, nothing lost."""
    import sqlite3

    from service.core.run.journal import Journaling
    from service.state.files import journal as files_journal
    from service.state.files.journal import CHECKPOINT_EVERY, FileRunJournal
    from service.state.files.sqlite import connect

    journal = FileRunJournal(tmp_path)
    await journal.open()
    try:
        logged = numbered(*(events.content_delta("c_1", f"d{n}") for n in range(4)))
        assert journal.write_now([begin("r1"), *entries_of("r1", logged[:1])])
        other = connect(journal.path)  # another connection writing
        other.execute("BEGIN IMMEDIATE")
        assert journal.write_now(entries_of("r1", logged[1:2]))  # events: no transaction
        assert not journal.write_now([*entries_of("r1", logged[2:3]), step("r1", "turn 1", 1)])
        journaling = Journaling(journal)
        journaling.submit(entries_of("r1", logged[2:3])[0])
        journaling.submit(step("r1", "turn 1", 1))
        journaling.submit(entries_of("r1", logged[3:])[0])
        waiting = asyncio.ensure_future(journaling.flush())
        await asyncio.sleep(0.2)
        assert not waiting.done()  # the thread waits for the other's lock
        other.execute("COMMIT")
        await asyncio.wait_for(waiting, 10)
        kept = await journal.load("r1")
        assert kept is not None and kept.events == logged and kept.steps == {"turn 1": 1}
        assert journal.write_now([JournalEntry("r1", "end")])  # its events: swept later
        assert await journal.load("r1") is None and await journal.unfinished() == []
        assert journal.write_now([begin("r1")])  # (steps of a run again, for what follows)
        other.close()
        wal = journal.path.with_name(journal.path.name + "-wal")
        sizes = []
        monkeypatch.setattr(files_journal, "WAL_RESTART_BYTES", 1024 * 1024)
        for rounds in range(8):  # the thread checkpoints: the write-ahead log starts over
            for n in range(CHECKPOINT_EVERY):  # as `Journaling` writes: at once, else by `write`
                batch = [step("r1", f"turn {rounds}.{n}", n)]
                if not journal.write_now(batch):  # a checkpoint is running
                    await journal.write(batch)
            await asyncio.sleep(0.2)
            sizes.append(wal.stat().st_size)
        assert max(sizes) < 3 * 1024 * 1024, sizes  # bounded: it starts over
    finally:
        await journal.close()
    with sqlite3.connect(journal.path) as db:  # no event went to the database
        assert db.execute("SELECT COUNT(*) FROM journal_events").fetchone() == (0,)


def segment_files(directory: Path) -> list[str]:
    return sorted(p.name for p in (directory / "journal-events").glob("*.log"))


async def test_the_files_journal_keeps_events_in_segments_and_moves_old_ones_to_its_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events go to segment files; a segment full, the next (created ahead, off the loop)
    takes over; a run whose events are older than the last two segments has them moved into
    the database, and a segment no run in flight (nor an ended run whose rows are still to
    sweep) has events in is deleted. A run's journal reads the same wherever its events
    are."""
    import sqlite3

    from service.state.files import journal as files_journal
    from service.state.files import segments
    from service.state.files.journal import FileRunJournal

    monkeypatch.setattr(segments, "SEGMENT_BYTES", 4096)
    monkeypatch.setattr(files_journal, "SWEEP_AFTER_S", 0.001)

    def in_database(run_id: str) -> int:
        with sqlite3.connect(tmp_path / "journal.sqlite3") as db:
            query = "SELECT COUNT(*) FROM journal_events WHERE run_id = ?"
            return int(db.execute(query, (run_id,)).fetchone()[0])

    journal = FileRunJournal(tmp_path)
    await journal.open()
    try:
        long = numbered(*(events.content_delta("c_1", "x" * 100) for n in range(200)))
        assert journal.write_now([begin("long"), *entries_of("long", long[:1])])
        assert segment_files(tmp_path) == ["0000000001.log"]
        written = 1
        for n in range(60):  # short runs come and go while `long` runs
            run_id = f"short{n}"
            short = numbered(*(events.content_delta("c_1", "y" * 100) for _ in range(3)))
            batches = [
                [begin(run_id), *entries_of(run_id, short[:1])],
                entries_of(run_id, short[1:]),
                entries_of("long", long[written : written + 3]),
                [JournalEntry(run_id, "end")],
            ]
            written += 3
            for batch in batches:
                if not journal.write_now(batch):  # the next segment is not created yet
                    await journal.write(batch)
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.01)  # the last ended runs swept
        await journal._run(lambda: None)  # what the thread was given is done
        assert 0 < in_database("long") < written  # its older events, moved
        assert all(in_database(f"short{n}") == 0 for n in range(60))  # never moved
        kept = await journal.load("long")
        assert kept is not None and kept.events == long[:written]
        files = segment_files(tmp_path)
        assert len(files) <= 3 and files[0] != "0000000001.log", files
    finally:
        await journal.close()
    again = FileRunJournal(tmp_path)  # the next process: what it finds, in its database
    await again.open()
    try:
        kept = await again.load("long")
        assert kept is not None and kept.events == long[:written]
        assert await again.unfinished() == ["long"]
        assert in_database("long") == written and len(segment_files(tmp_path)) == 1
    finally:
        await again.close()


def test_the_events_of_many_runs_are_read_from_each_segment_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `_settle` moves into the database: the events of the runs asked for, from the
    segment each gives on, each segment read once for all of them (not once a run)."""
    from service.state.files import segments as segment_files_module
    from service.state.files.segments import Segments, record

    monkeypatch.setattr(segment_files_module, "SEGMENT_BYTES", 2048)
    segments = Segments(tmp_path)
    segments.start()
    for n in range(300):
        run_id = f"run{n % 7}"
        segments.append(record(run_id.encode(), n, f"event {n}".encode() * 8), [run_id])
    last = segments.number
    assert last > 5
    since = {"run1": 1, "run3": 3, "run6": last - 1}
    expected = {run_id: segments.read(run_id, first) for run_id, first in since.items()}
    reads: list[int] = []
    real = Segments.path

    def path(self: Segments, number: int) -> Path:
        reads.append(number)
        return real(self, number)

    monkeypatch.setattr(Segments, "path", path)
    found = list(segments.read_runs(since, last))
    assert sorted(reads) == list(range(1, last + 1))  # each segment once
    assert {r: [(seq, data) for rid, seq, data in found if rid == r] for r in since} == expected
    assert all(expected.values())
    segments.close()


async def test_a_torn_record_ends_what_is_read_of_its_segment(tmp_path: Path) -> None:
    """A power cut may leave the last write of a segment cut short: the next start keeps
    every whole record before it, and the run's journal reads as it was written."""
    from service.state.files.journal import FileRunJournal

    first = FileRunJournal(tmp_path)
    await first.open()
    logged = numbered(*(events.content_delta("c_1", f"d{n}") for n in range(3)))
    assert first.write_now([begin("r1"), *entries_of("r1", logged[:2])])
    assert first.write_now(entries_of("r1", logged[2:]))
    await first.close()
    (segment,) = (tmp_path / "journal-events").glob("*.log")
    whole = segment.read_bytes()
    segment.write_bytes(whole[:-3])  # the last record cut short
    second = FileRunJournal(tmp_path)
    await second.open()
    try:
        kept = await second.load("r1")
        assert kept is not None and kept.events == logged[:2]
    finally:
        await second.close()


async def test_an_ended_run_is_gone_at_once_its_rows_swept_soon_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files journal held alone: a run's end writes nothing then; the run is unknown at
    once, and its rows go with the next sweep (within SWEEP_AFTER_S, even if nothing else
    is written)."""
    import sqlite3

    from service.state.files import journal as files_journal
    from service.state.files.journal import FileRunJournal

    monkeypatch.setattr(files_journal, "SWEEP_AFTER_S", 0.05)

    def rows(table: str) -> int:
        with sqlite3.connect(tmp_path / "journal.sqlite3") as db:
            return int(db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])

    journal = FileRunJournal(tmp_path)
    await journal.open()
    try:
        logged = numbered(events.run_start("a"), events.run_complete("stop"))
        assert journal.write_now([begin("r1"), JournalEntry("r1", "start", "turn 1")])
        assert journal.write_now([*entries_of("r1", logged), step("r1", "turn 1", 1)])
        assert journal.write_now([JournalEntry("r1", "end")])
        assert await journal.load("r1") is None and await journal.unfinished() == []
        assert (rows("journal_runs"), rows("journal_steps")) == (1, 1)  # not yet
        await asyncio.sleep(0.1)
        await journal._run(lambda: None)
        assert (rows("journal_runs"), rows("journal_steps")) == (0, 0)
    finally:
        await journal.close()


def test_a_run_ended_before_a_kill_is_found_ended_by_the_next_process(tmp_path: Path) -> None:
    """Killed between a run's end and the sweep, the process leaves the run with its
    terminal event journaled: the next one finds it ended (and keeps it again)."""
    import subprocess
    import sys

    script = f"""
import asyncio, json, os
from pathlib import Path
from service.core import events
from service.core.run.journal import JournalEntry, entries_of
from service.state.files.journal import FileRunJournal

async def main():
    journal = FileRunJournal(Path({str(tmp_path)!r}))
    await journal.open()
    made = [events.run_start("a"), events.run_complete("stop")]
    for seq, event in enumerate(made, 1):
        event.seq, event.run_id, event.chat_id = seq, "r1", "c1"
    begin = JournalEntry("r1", "begin", "c1", json.dumps({{"agentKey": "a"}}).encode())
    assert journal.write_now([begin, *entries_of("r1", made)])
    assert journal.write_now([JournalEntry("r1", "end")])
    os.kill(os.getpid(), 9)

asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == -9, done.stderr.decode()

    async def next_process() -> None:
        from service.state.files.journal import FileRunJournal

        journal = FileRunJournal(tmp_path)
        await journal.open()
        try:
            assert await journal.unfinished() == ["r1"]
            kept = await journal.load("r1")
            assert kept is not None and kept.ended and len(kept.events) == 2
        finally:
            await journal.close()

    asyncio.run(next_process())


async def test_the_events_of_ended_runs_are_swept_with_others_and_at_the_next_start(
    tmp_path: Path,
) -> None:
    """(The events in the database: those of a process that does not hold the journal alone,
    as here, and those moved out of old segments.)"""
    import fcntl
    import os
    import sqlite3

    from service.state.files.journal import SWEEP_EVERY, FileRunJournal

    def events_kept() -> int:
        with sqlite3.connect(tmp_path / "journal.sqlite3") as db:
            return int(db.execute("SELECT COUNT(*) FROM journal_events").fetchone()[0])

    held = os.open(tmp_path / "journal.sqlite3.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)  # another process holds the journal too
    journal = FileRunJournal(tmp_path)
    await journal.open()
    assert not (tmp_path / "journal-events").exists()
    logged = numbered(events.run_start("a"))
    for n in range(SWEEP_EVERY):
        run_id = f"r{n}"
        await journal.write([begin(run_id), *entries_of(run_id, logged)])
        await journal.write([JournalEntry(run_id, "end")])
    await journal.write([begin("last"), *entries_of("last", logged)])
    assert events_kept() == 1  # SWEEP_EVERY runs ended: their events deleted together
    await journal.write([JournalEntry("last", "end")])
    assert events_kept() == 1  # not yet
    journal._ended.clear()  # as if the process stopped before its sweep
    await journal.close()
    os.close(held)
    again = FileRunJournal(tmp_path)
    await again.open()
    try:
        assert events_kept() == 0 and await again.unfinished() == []
    finally:
        await again.close()
