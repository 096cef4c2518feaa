"""The file `RunJournal`: the journals of the runs in flight, in one SQLite database.

`{dir}/journal.sqlite3` holds, per run begun and not yet kept, what it started
with, its events and its steps' results (service/core/run/journal.py). Each
batch of entries is one transaction; the database is in WAL mode with
`synchronous=NORMAL`, so a killed process loses nothing that was committed (a
power cut may lose the last batches, as the page cache would). When a run is
kept (its log in the run log), its entries are deleted.

A small batch of events and steps is committed on the event loop (`write_now`): in WAL
mode with `synchronous=NORMAL` a commit appends to the write-ahead log in the page
cache and never calls fsync, so it costs microseconds and the run's readers are
woken in the same loop turn. That connection never waits: it has no busy time-out
(a lock held by another process sends the batch to the thread instead) and never
checkpoints — the thread checkpoints the log every `CHECKPOINT_EVERY` commits, as
it is the one that may fsync. Those checkpoints are PASSIVE: they never hold a batch
back, and the log starts over at the next quiet moment. Under a load with no quiet
moment the log grows, up to `WAL_RESTART_BYTES`: then a RESTART checkpoint holds the
batches of its few milliseconds (they go to the thread, after it) and the log starts
over. Everything else — opening, reads, a batch the loop
could not write — runs on one thread of its own, one statement after another; a
batch is never written while another is being written (`Journaling`).

A run's end deletes its row and its steps at once (it is no longer unfinished, and
`load` knows it no more); its events, many rows, are deleted by the thread with
those of the other runs ended in the meantime (`SWEEP_EVERY` runs or
`SWEEP_AFTER_S`), and at the next start if the process stopped before.

While the service's process holds the journal alone (an exclusive lock on
`journal.sqlite3.lock`; workers sharing the file do not), it knows how often each of
its runs resumed without asking the database on every batch.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from agw.v1 import events_pb2 as pb

from service.core.run.journal import JournaledRun, JournalEntry
from service.state.files.sqlite import connect

T = TypeVar("T")

log = logging.getLogger("agw.journal")

DATABASE = "journal.sqlite3"
#: How many commits from the event loop between two checkpoints of the write-ahead log.
CHECKPOINT_EVERY = 200
#: The write-ahead log's size past which a checkpoint makes it start over (RESTART).
WAL_RESTART_BYTES = 64 * 1024 * 1024
#: The largest batch committed on the event loop: a busier loop turn's batch goes to the
#: thread, which works beside the loop (and takes in one transaction what the loop adds
#: meanwhile).
WRITE_NOW_MAX = 8
#: The events of ended runs are deleted once this many runs ended, or after this long.
SWEEP_EVERY = 64
SWEEP_AFTER_S = 1.0
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS journal_runs ("
    " run_id TEXT PRIMARY KEY, chat_id TEXT NOT NULL, record TEXT NOT NULL,"
    " attempts INTEGER NOT NULL DEFAULT 0, begun INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS journal_events ("
    " run_id TEXT NOT NULL, seq INTEGER NOT NULL, event BLOB NOT NULL,"
    " PRIMARY KEY (run_id, seq)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS journal_steps ("
    " run_id TEXT NOT NULL, key TEXT NOT NULL, position INTEGER NOT NULL, result TEXT,"
    " PRIMARY KEY (run_id, key)) WITHOUT ROWID",
)


class FileRunJournal:
    """Keeps the journals of the runs in flight in `{directory}/journal.sqlite3`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._db: sqlite3.Connection | None = None  # of the thread
        self._now: sqlite3.Connection | None = None  # of the event loop: never waits
        self._commits = 0  # on the event loop since the last checkpoint
        self._ended: list[str] = []  # runs ended whose events are still to delete
        self._swept = time.monotonic()
        self._lock: int | None = None  # the file held while this process holds it alone
        self._attempts: dict[str, int] | None = None  # known, while held alone
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agw-journal")
        self._position = 0  # orders the steps of a run as they were journaled

    @property
    def path(self) -> Path:
        return self.directory / DATABASE

    async def _run(self, func: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, func, *args)

    async def open(self) -> None:
        await self._run(self._open)

    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            db = connect(self.path)  # workers of one host may open it at once
        except sqlite3.Error as error:
            raise OSError(f"{self.path}: not a usable run journal ({error})") from error
        try:
            for statement in SCHEMA:
                db.execute(statement)
            row = db.execute("SELECT COALESCE(MAX(position), 0) FROM journal_steps").fetchone()
        except sqlite3.Error as error:
            db.close()
            raise OSError(f"{self.path}: not a usable run journal ({error})") from error
        self._position = int(row[0])
        self._db = db
        self._sweep_orphans()
        self._hold_alone()
        now = connect(self.path)
        now.execute("PRAGMA busy_timeout = 0")
        now.execute("PRAGMA wal_autocheckpoint = 0")
        self._now = now

    async def write(self, entries: Sequence[JournalEntry]) -> None:
        await self._run(self._write, list(entries))

    def write_now(self, entries: Sequence[JournalEntry]) -> bool:
        if self._now is None or len(entries) > WRITE_NOW_MAX:
            return False  # a large batch is written on the thread, beside the loop's work
        try:
            self._now.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as error:
            if error.sqlite_errorcode == sqlite3.SQLITE_BUSY:
                return False  # another connection is writing: the thread waits for it
            raise
        self._commit(self._now, entries)
        self._commits += 1
        if self._commits >= CHECKPOINT_EVERY:
            self._commits = 0
            self._thread.submit(self._checkpoint)
        if self._sweep_due():
            self._thread.submit(self._sweep, self._take_ended())
        return True

    def _checkpoint(self) -> None:
        db = self._database()
        try:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            wal = self.path.with_name(DATABASE + "-wal")
            if wal.stat().st_size > WAL_RESTART_BYTES:
                db.execute("PRAGMA wal_checkpoint(RESTART)")
        except (OSError, sqlite3.Error) as error:  # the next one may do better
            log.warning("could not checkpoint the run journal %s: %s", self.path, error)

    def _write(self, entries: list[JournalEntry]) -> None:
        db = self._database()
        db.execute("BEGIN IMMEDIATE")
        self._commit(db, entries)
        if self._sweep_due():
            self._sweep(self._take_ended())

    # The events of ended runs -----------------------------------------------------

    def _sweep_due(self) -> bool:
        return len(self._ended) >= SWEEP_EVERY or (
            bool(self._ended) and time.monotonic() - self._swept >= SWEEP_AFTER_S
        )

    def _take_ended(self) -> list[str]:
        ended, self._ended = self._ended, []
        self._swept = time.monotonic()
        return ended

    def _sweep(self, run_ids: list[str]) -> None:
        """Delete the events of `run_ids` (ended runs), on the thread."""
        try:
            db = self._database()
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(
                    "DELETE FROM journal_events WHERE run_id = ?", [(r,) for r in run_ids]
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        except (sqlite3.Error, RuntimeError) as error:  # left for the next start
            log.warning("could not delete ended runs' events from %s: %s", self.path, error)

    def _sweep_orphans(self) -> None:
        """Delete the events of runs that ended before the process stopped."""
        db = self._database()
        db.execute(
            "DELETE FROM journal_events WHERE run_id NOT IN (SELECT run_id FROM journal_runs)"
        )

    # How often each run resumed -----------------------------------------------------

    def _hold_alone(self) -> None:
        """Take the journal's lock if no other process holds the journal."""
        fd = os.open(self.path.with_name(DATABASE + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another process has it too: ask the database on every batch
            os.close(fd)
            log.warning(
                "the run journal %s is open in another process too; each service process "
                "should have a runs directory of its own (AGW_RUNS_DIR)",
                self.path,
            )
            return
        self._lock = fd
        self._attempts = {}

    def _known_attempts(
        self, db: sqlite3.Connection, entries: Sequence[JournalEntry]
    ) -> dict[str, int]:
        """How often the runs of `entries` have resumed (what the journal holds); while the
        process holds the journal alone, kept in memory and asked of it once a run."""
        run_ids = {e.run_id for e in entries if e.kind != "begin"}
        known = self._attempts
        if known is None:
            return _attempts(db, run_ids)
        for entry in entries:
            if entry.kind == "begin":
                known[entry.run_id] = 0
        unknown = run_ids - known.keys()
        if unknown:
            known.update(_attempts(db, unknown))
        return known

    def _commit(self, db: sqlite3.Connection, entries: Sequence[JournalEntry]) -> None:
        """Apply `entries` in the transaction begun on `db`, and commit it."""
        try:
            attempts = self._known_attempts(db, entries)
            for entry in entries:
                if entry.kind not in ("begin", "resume") and entry.attempt < attempts.get(
                    entry.run_id, 0
                ):
                    continue  # written by an owner the run has since been taken from
                if entry.kind == "resume":
                    attempts[entry.run_id] = max(attempts.get(entry.run_id, 0), entry.attempt)
                self._apply(db, entry)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _apply(self, db: sqlite3.Connection, entry: JournalEntry) -> None:
        run_id = entry.run_id
        if entry.kind == "event":
            db.execute(
                "INSERT OR REPLACE INTO journal_events VALUES (?, ?, ?)",
                (run_id, int(entry.key), entry.data),
            )
        elif entry.kind in ("start", "step"):
            self._position += 1
            if entry.kind == "start":
                db.execute(
                    "INSERT OR IGNORE INTO journal_steps VALUES (?, ?, ?, NULL)",
                    (run_id, entry.key, self._position),
                )
            else:
                db.execute(
                    "INSERT INTO journal_steps VALUES (?, ?, ?, ?) ON CONFLICT (run_id, key)"
                    " DO UPDATE SET result = excluded.result",
                    (run_id, entry.key, self._position, entry.data.decode()),
                )
        elif entry.kind == "begin":
            db.execute(
                "INSERT OR REPLACE INTO journal_runs VALUES (?, ?, ?, 0,"
                " (SELECT COALESCE(MAX(begun), 0) + 1 FROM journal_runs))",
                (run_id, entry.key, entry.data.decode()),
            )
        elif entry.kind == "resume":  # (the resumes known: updated by `_commit`)
            db.execute(
                "UPDATE journal_runs SET attempts = MAX(attempts, ?) WHERE run_id = ?",
                (int(entry.key), run_id),
            )
        elif entry.kind == "end":  # its events: swept with others' (`_sweep`)
            for table in ("journal_runs", "journal_steps"):
                db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            self._ended.append(run_id)
            if self._attempts is not None:
                self._attempts.pop(run_id, None)

    async def unfinished(self) -> list[str]:
        return await self._run(self._unfinished)

    def _unfinished(self) -> list[str]:
        rows = self._database().execute("SELECT run_id FROM journal_runs ORDER BY begun")
        return [str(run_id) for (run_id,) in rows]

    async def load(self, run_id: str) -> JournaledRun | None:
        return await self._run(self._load, run_id)

    def _load(self, run_id: str) -> JournaledRun | None:
        db = self._database()
        row = db.execute(
            "SELECT chat_id, record, attempts FROM journal_runs WHERE run_id = ?", (run_id,)
        ).fetchone()
        if row is None:
            return None
        journaled = JournaledRun(run_id, row[0], json.loads(row[1]), attempts=int(row[2]))
        for (data,) in db.execute(
            "SELECT event FROM journal_events WHERE run_id = ? ORDER BY seq", (run_id,)
        ):
            journaled.events.append(pb.Event.FromString(data))
        for key, result in db.execute(
            "SELECT key, result FROM journal_steps WHERE run_id = ? ORDER BY position", (run_id,)
        ):
            if result is None:
                journaled.started.add(key)
            else:
                journaled.steps[key] = json.loads(result)
        return journaled

    def _database(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("the run journal is not open")
        return self._db

    async def close(self) -> None:
        if self._now is not None:
            self._now.close()
            self._now = None
        if self._db is not None:
            if self._ended:
                await self._run(self._sweep, self._take_ended())
            await self._run(self._db.close)
            self._db = None
        if self._lock is not None:
            os.close(self._lock)  # lets go of the lock
            self._lock = None
        self._thread.shutdown(wait=True)


def _attempts(db: sqlite3.Connection, run_ids: set[str]) -> dict[str, int]:
    """How often each of `run_ids` has resumed, as the journal holds it."""
    if not run_ids:
        return {}
    marks = ",".join("?" * len(run_ids))
    rows = db.execute(
        f"SELECT run_id, attempts FROM journal_runs WHERE run_id IN ({marks})",
        sorted(run_ids),
    )
    return {str(run_id): int(attempts) for run_id, attempts in rows}
