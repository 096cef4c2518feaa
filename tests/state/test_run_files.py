"""The file run log: one SQLite database, kept across restarts, pruned, importing old files."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from service.core import events
from service.core.errors import StoreFailed
from service.core.events import Event
from service.core.run.eventlog import EventLog
from service.core.run.journal import JournalEntry, Journaling
from service.state.files.run_log import DATABASE, FileRunLog
from service.state.framing import decode_events, encode_events

RUN = "0123456789abcdef"


def ended_run(run_id: str, text: str) -> list[Event]:
    log = [events.run_start("a"), events.content_delta("c1", text), events.run_complete("stop")]
    for seq, event in enumerate(log, 1):
        event.seq, event.run_id, event.chat_id = seq, run_id, "chat"
    return log


async def test_logs_outlive_the_process_in_one_file(tmp_path: Path) -> None:
    first = FileRunLog(tmp_path / "runs", ttl_s=3600)
    await first.open()
    await first.save(RUN, ended_run(RUN, "hello"))
    await first.save("fedcba9876543210", ended_run("fedcba9876543210", "other"))
    await first.close()
    assert sorted(p.name for p in (tmp_path / "runs").glob("*.events")) == []
    again = FileRunLog(tmp_path / "runs", ttl_s=3600)
    await again.open()
    try:
        assert await again.load(RUN) == ended_run(RUN, "hello")
        assert await again.load("fedcba9876543210") == ended_run("fedcba9876543210", "other")
        assert await again.load("ffffffffffffffff") is None
        assert await again.load("../../etc/passwd") is None
    finally:
        await again.close()
    assert (tmp_path / "runs" / DATABASE).is_file()


async def test_a_second_save_of_a_run_replaces_its_log(tmp_path: Path) -> None:
    log = FileRunLog(tmp_path, ttl_s=3600)
    await log.open()
    try:
        await log.save(RUN, ended_run(RUN, "first"))
        await log.save(RUN, ended_run(RUN, "second"))
        assert await log.load(RUN) == ended_run(RUN, "second")
    finally:
        await log.close()


async def test_expired_logs_are_neither_read_nor_kept(tmp_path: Path) -> None:
    log = FileRunLog(tmp_path, ttl_s=0.2)
    await log.open()
    try:
        await log.save(RUN, ended_run(RUN, "old"))
        assert await log.load(RUN) == ended_run(RUN, "old")
        await asyncio.sleep(0.3)
        assert await log.load(RUN) is None
        await log._run(log.prune)
        log.ttl_s = 3600
        assert await log.load(RUN) is None  # deleted, not only hidden
    finally:
        await log.close()


async def test_logs_kept_as_files_by_earlier_versions_are_moved_in(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / f"{RUN}.events").write_bytes(encode_events(ended_run(RUN, "from a file")))
    expired = runs / "fedcba9876543210.events"
    expired.write_bytes(encode_events(ended_run("fedcba9876543210", "expired")))
    week_ago = time.time() - 7 * 86400
    os.utime(expired, (week_ago, week_ago))
    (runs / f"{RUN}.tmp").write_bytes(b"half a write")
    log = FileRunLog(runs, ttl_s=86400)
    await log.open()
    try:
        assert await log.load(RUN) == ended_run(RUN, "from a file")
        assert await log.load("fedcba9876543210") is None
    finally:
        await log.close()
    assert sorted(p.name for p in runs.iterdir() if not p.name.startswith(DATABASE)) == []


async def test_a_file_that_is_not_a_database_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / DATABASE).write_bytes(b"not a database, " * 512)
    log = FileRunLog(tmp_path, ttl_s=3600)
    with pytest.raises(RuntimeError, match=f"cannot use the run log {tmp_path / DATABASE}"):
        await log.open()
    await log.close()


async def test_many_old_files_are_moved_in_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("service.state.files.run_log.IMPORT_BATCH", 2)
    runs = [f"{n:016x}" for n in range(5)]
    for run_id in runs:
        (tmp_path / f"{run_id}.events").write_bytes(encode_events(ended_run(run_id, run_id)))
    (tmp_path / "not-a-run-id.events").write_bytes(b"ignored")
    log = FileRunLog(tmp_path, ttl_s=86400)
    await log.open()
    try:
        for run_id in runs:
            assert await log.load(run_id) == ended_run(run_id, run_id)
    finally:
        await log.close()
    assert [name for name in os.listdir(tmp_path) if name.endswith(".events")] == []


async def test_the_logs_of_runs_ending_together_are_one_transaction(tmp_path: Path) -> None:
    log = FileRunLog(tmp_path, ttl_s=3600)
    await log.open()
    commits: list[int] = []
    save_all = log._save_all

    def counted(logs: list[tuple[str, bytes]]) -> None:
        commits.append(len(logs))
        save_all(logs)

    log._save_all = counted  # type: ignore[method-assign]
    ids = [f"{n:016x}" for n in range(1, 9)]
    try:
        await asyncio.gather(*(log.save(run_id, ended_run(run_id, run_id)) for run_id in ids))
        assert commits == [8]
        for run_id in ids:
            assert await log.load(run_id) == ended_run(run_id, run_id)
    finally:
        await log.close()


async def test_a_failed_batch_fails_every_run_in_it_and_keeps_none_of_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = FileRunLog(tmp_path, ttl_s=3600)
    await log.open()
    insert = log._insert

    def failing(run_id: str, saved_at: float, data: bytes) -> None:
        if run_id.endswith("2"):
            raise sqlite3.OperationalError("database or disk is full")
        insert(run_id, saved_at, data)

    monkeypatch.setattr(log, "_insert", failing)
    ids = [f"{n:016x}" for n in range(1, 4)]
    try:
        outcomes = await asyncio.gather(
            *(log.save(run_id, ended_run(run_id, "x")) for run_id in ids), return_exceptions=True
        )
        assert all(isinstance(o, StoreFailed) for o in outcomes), outcomes
        assert "disk is full" in str(outcomes[0])
        monkeypatch.undo()
        assert [await log.load(run_id) for run_id in ids] == [None, None, None]
        await log.save(ids[0], ended_run(ids[0], "again"))  # a later batch is kept
        assert await log.load(ids[0]) == ended_run(ids[0], "again")
    finally:
        await log.close()


async def test_a_journaled_runs_log_is_kept_as_the_bytes_its_journal_wrote() -> None:
    written: list[JournalEntry] = []

    class Journal:
        async def write(self, entries: Sequence[JournalEntry]) -> None:
            written.extend(entries)

        def write_now(self, entries: Sequence[JournalEntry]) -> bool:
            written.extend(entries)
            return True

    journaling = Journaling(Journal())
    run_log = EventLog(RUN, "chat", journaling=journaling)
    for event in ended_run(RUN, "hello"):
        event.ClearField("seq")
        run_log.emit(event)
    await journaling.flush()
    raw = [entry.data for entry in written if entry.kind == "event"]
    assert [e.SerializeToString() for e in run_log] == raw
    before = list(run_log)
    framed = encode_events(run_log)  # takes the journal's bytes
    assert run_log.serialized() is None  # taken once, by the run log
    assert framed == encode_events(list(run_log))
    assert decode_events(framed) == list(run_log) == before


async def test_an_ended_run_kept_holds_its_events_as_bytes_and_reads_the_same() -> None:
    """Once the run log took the bytes, the log holds those rather than parsed events (a
    tenth of the memory while the run is kept): every way of reading it gives the same
    events, a reader following it from any seq too."""

    class Journal:
        async def write(self, entries: Sequence[JournalEntry]) -> None:
            return None

        def write_now(self, entries: Sequence[JournalEntry]) -> bool:
            return True

    journaling = Journaling(Journal())
    log = EventLog(RUN, "chat", journaling=journaling)
    for event in ended_run(RUN, "hello") * 2:
        if not log.done:
            event.ClearField("seq")
            log.emit(event)
    await journaling.flush()
    before = [Event.FromString(e.SerializeToString()) for e in log]
    terminal = log.terminal
    encode_events(log)
    held = log._events  # what the log holds: every event but the terminal one as bytes
    assert [type(e) for e in held] == [bytes] * (len(before) - 1) + [Event]
    assert list(log) == before and len(log) == len(before)
    assert [log[i] for i in range(len(log))] == before == [log[i - len(log)] for i in range(3)]
    assert list(log[1:]) == before[1:]
    assert log.terminal is terminal and log[-1] is terminal
    for after_seq in range(len(before) + 1):
        assert [e async for e in log.follow(after_seq)] == before[after_seq:]
    with pytest.raises(IndexError):
        log[len(before)]


async def test_a_live_runs_events_its_only_reader_read_are_held_as_bytes() -> None:
    """While its only reader waits, a journaled run holds the events that reader has read as
    their bytes; a reader joining later, and the log read by index, get the same events,
    and the first reader goes on with the run's next events to its end."""

    class Journal:
        async def write(self, entries: Sequence[JournalEntry]) -> None:
            return None

        def write_now(self, entries: Sequence[JournalEntry]) -> bool:
            return True

    journaling = Journaling(Journal())
    log = EventLog(RUN, "chat", journaling=journaling)
    first, second, terminal = ended_run(RUN, "hello")
    for event in (first, second):
        event.ClearField("seq")
        log.emit(event)
    await journaling.flush()
    received: list[Event] = []

    async def send(event: Event) -> None:
        received.append(event)

    relay = asyncio.create_task(log.relay(0, send))
    async with asyncio.timeout(5):
        while len(received) < 2 or not log._waiters:  # noqa: ASYNC110 (the reader waits)
            await asyncio.sleep(0.001)
    assert [type(e) for e in log._events] == [bytes, bytes]
    assert list(log) == received == [log[0], log[1]]
    terminal.ClearField("seq")
    log.emit(terminal)
    await journaling.flush()
    await asyncio.wait_for(relay, 5)
    assert [e.seq for e in received] == [1, 2, 3] and received[2] is log.terminal
    assert [e async for e in log.follow(0)] == received  # a later reader: the same events
