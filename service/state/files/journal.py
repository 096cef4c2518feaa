"""The file `RunJournal`: the journals of the runs in flight, in one SQLite database and,
for their events, segment files.

`{dir}/journal.sqlite3` holds, per run begun and not yet kept, what it started
with and its steps' results (service/core/run/journal.py); its events — one per delta,
most of what a journal writes — are appended to `{dir}/journal-events/` while the process
holds the journal alone (service/state/files/segments.py: one `os.write` per batch, no
transaction), and kept in the database otherwise, and once they are older than the last
segments. Each batch's events are written before its rows, and its rows are one
transaction; the database is in WAL mode with `synchronous=NORMAL`, so a killed process
loses nothing that was written (a power cut may lose the last batches, as the page cache
would). When a run is kept (its log in the run log), its entries are deleted.

A batch is written on the event loop (`write_now`) when that takes no waiting: its events
appended to their segment, and up to `WRITE_NOW_MAX` rows committed — in WAL mode with
`synchronous=NORMAL` a commit appends to the write-ahead log in the page cache and never
calls fsync, so it costs microseconds and the run's readers are woken in the same loop
turn. That connection never waits: it has no busy time-out (a lock held by another
connection sends the batch to the thread instead) and never checkpoints — the thread
checkpoints the log every `CHECKPOINT_EVERY` commits, as it is the one that may fsync.
Those checkpoints are PASSIVE: they never hold a batch back, and the log starts over at
the next quiet moment. Under a load with no quiet moment the log grows, up to
`WAL_RESTART_BYTES`: then a RESTART checkpoint holds the batches of its few milliseconds
(they go to the thread, after it) and the log starts over. Everything else — opening,
reads, creating the next segment, moving old events into the database, a batch the loop
could not write — runs on one thread of its own, one statement after another; a batch is
never written while another is being written (`Journaling`).

A run's end makes it unknown to `load` and `unfinished` at once. Its rows — its
row, its steps, its events in the database — are deleted by the thread with those of
the other runs ended in the meantime (`SWEEP_EVERY` runs or `SWEEP_AFTER_S`), in one
transaction, and at the next start if the process stopped before; a segment is deleted
once no run in flight, nor an ended run whose rows are still there, has events in it.
(So a process killed in between leaves runs that ended, with their terminal event
journaled: the next one keeps them again, which a run's keeping allows.) While the
process does not hold the journal alone, an end deletes the run's row and steps in its
batch's transaction. At the next start, the events the segments hold of the runs still
in flight are moved into the database.

While the service's process holds the journal alone (an exclusive lock on
`journal.sqlite3.lock`; workers sharing the file do not), it knows how often each of
its runs resumed without asking the database on every batch, and its events go to
segments.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from agw.v1 import events_pb2 as pb

from service.core.run.journal import JournaledRun, JournalEntry
from service.state.files.segments import Segments, record
from service.state.files.sqlite import connect

T = TypeVar("T")

log = logging.getLogger("agw.journal")

DATABASE = "journal.sqlite3"
#: How many commits from the event loop between two checkpoints of the write-ahead log.
CHECKPOINT_EVERY = 200
#: The write-ahead log's size past which a checkpoint makes it start over (RESTART).
WAL_RESTART_BYTES = 64 * 1024 * 1024
#: The most rows of a batch committed on the event loop (events appended to a segment are
#: not rows): a busier loop turn's batch goes to the thread, which works beside the loop
#: (and takes in one transaction what the loop adds meanwhile).
WRITE_NOW_MAX = 8
#: The events of ended runs are deleted once this many runs ended, or after this long.
SWEEP_EVERY = 64
SWEEP_AFTER_S = 1.0
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS journal_runs ("
    " run_id TEXT PRIMARY KEY, chat_id TEXT NOT NULL, record TEXT NOT NULL,"
    " attempts INTEGER NOT NULL DEFAULT 0, begun INTEGER NOT NULL)",
    # A run's `begun` is the next after the highest: found in the index, not by a scan of
    # every run in flight (thousands may be parked).
    "CREATE INDEX IF NOT EXISTS journal_runs_begun ON journal_runs (begun)",
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
        self._unkept: set[str] = set()  # of those, the ones whose row and steps are too
        self._swept = time.monotonic()
        self._sweeping: asyncio.TimerHandle | None = None  # a sweep due while nothing writes
        self._lock: int | None = None  # the file held while this process holds it alone
        self._attempts: dict[str, int] | None = None  # known, while held alone
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agw-journal")
        self._position = 0  # orders the steps of a run as they were journaled
        # The events, while the process holds the journal alone (service/state/files/segments.py).
        self._segments: Segments | None = None

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
        self._hold_alone()
        if self._attempts is not None:  # held alone: its events go to segments
            self._segments = self._recover(Segments(self.directory))
        self._sweep_orphans()
        now = connect(self.path)
        now.execute("PRAGMA busy_timeout = 0")
        now.execute("PRAGMA wal_autocheckpoint = 0")
        self._now = now

    async def write(self, entries: Sequence[JournalEntry]) -> None:
        await self._run(self._write, list(entries))

    def write_now(self, entries: Sequence[JournalEntry]) -> bool:
        segments = self._segments
        if segments is not None and self._append_events(segments, entries):
            return True
        rows = len(entries) if segments is None else sum(e.kind != "event" for e in entries)
        if self._now is None or rows > WRITE_NOW_MAX:
            return False  # a large batch is written on the thread, beside the loop's work
        if segments is not None and not segments.ready():
            return False  # the next segment is yet to be created, off the loop
        if rows:
            try:
                self._now.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as error:
                if error.sqlite_errorcode == sqlite3.SQLITE_BUSY:
                    return False  # another connection is writing: the thread waits for it
                raise
            self._commit(self._now, entries, database=True)
            self._commits += 1
            if self._commits >= CHECKPOINT_EVERY:
                self._commits = 0
                self._thread.submit(self._checkpoint)
        else:  # events alone: appended to their segment, no transaction
            self._commit(self._now, entries, database=False)
        if segments is not None and segments.needs_preparing():
            self._thread.submit(segments.prepare)
        if self._sweep_due():
            self._thread.submit(self._sweep, self._take_ended())
        return True

    def _append_events(self, segments: Segments, entries: Sequence[JournalEntry]) -> bool:
        """Write a batch of events and ends alone, of runs this process knows, with no
        transaction: the events to their segment, the ends for the next sweep; False, having
        written nothing, for any other batch (the per-delta path: most batches)."""
        known = self._attempts
        if known is None or not segments.ready():
            return False
        records = []
        runs = []
        ends = []
        for entry in entries:
            attempts = known.get(entry.run_id)
            if attempts is None or (entry.kind != "event" and entry.kind != "end"):
                return False
            if entry.attempt < attempts:
                continue  # written by an owner the run has since been taken from
            if entry.kind == "end":
                ends.append(entry.run_id)
            else:
                records.append(record(entry.run_id.encode(), int(entry.key), entry.data))
                runs.append(entry.run_id)
        if records and segments.append(b"".join(records), runs) is not None:
            self._thread.submit(self._settle)
        for run_id in ends:
            del known[run_id]
            self._unkept.add(run_id)
            self._ended.append(run_id)
            segments.end(run_id)
        if segments.needs_preparing():
            self._thread.submit(segments.prepare)
        if self._ended and self._sweep_due():
            self._thread.submit(self._sweep, self._take_ended())
        elif ends and self._sweeping is None:  # within SWEEP_AFTER_S, even if nothing writes
            self._sweeping = asyncio.get_running_loop().call_later(SWEEP_AFTER_S, self._sweep_now)
        return True

    def _sweep_now(self) -> None:
        self._sweeping = None
        if self._ended and self._db is not None:
            self._thread.submit(self._sweep, self._take_ended())

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
        self._commit(db, entries, database=True)
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
        """Delete the events of `run_ids` (ended runs), and the row and steps of those whose
        end left them (`_unkept`), on the thread."""
        unkept = [(r,) for r in run_ids if r in self._unkept]
        try:
            db = self._database()
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(
                    "DELETE FROM journal_events WHERE run_id = ?", [(r,) for r in run_ids]
                )
                for table in ("journal_runs", "journal_steps"):
                    db.executemany(f"DELETE FROM {table} WHERE run_id = ?", unkept)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            segments = self._segments
            for (run_id,) in unkept:
                self._unkept.discard(run_id)
                if segments is not None:
                    segments.forget(run_id)
            if segments is not None:
                segments.drop()
        except (OSError, sqlite3.Error, RuntimeError) as error:  # left for the next start
            log.warning("could not delete ended runs' events from %s: %s", self.path, error)

    def _sweep_orphans(self) -> None:
        """Delete the events of runs that ended before the process stopped."""
        db = self._database()
        db.execute(
            "DELETE FROM journal_events WHERE run_id NOT IN (SELECT run_id FROM journal_runs)"
        )

    # The events' segments ---------------------------------------------------------------

    def _recover(self, segments: Segments) -> Segments:
        """Move the events a previous process left in segments, of the runs still in flight,
        into the database; then begin a new segment (at open)."""
        db = self._database()
        live = {str(r) for (r,) in db.execute("SELECT run_id FROM journal_runs")}
        self._insert_events((r, seq, data) for r, seq, data in segments.recover() if r in live)
        segments.start()
        return segments

    def _insert_events(self, rows: Iterable[tuple[str, int, bytes]]) -> None:
        """Keep events in the database, in one transaction (on the thread)."""
        db = self._database()
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany("INSERT OR REPLACE INTO journal_events VALUES (?, ?, ?)", rows)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _settle(self) -> None:
        """Move the events of the runs with events in old segments into the database, then
        delete the segments no run needs (on the thread, once a segment is begun)."""
        segments = self._segments
        if segments is None:
            return
        try:
            old = segments.old()
            upto = segments.number - 1  # the newest segment closed
            if old:  # (each segment read once for all the runs: not once a run)
                self._insert_events(segments.read_runs(old, upto))
                segments.settled(old, upto)
            segments.drop()
        except (OSError, sqlite3.Error, RuntimeError) as error:  # tried again at the next
            log.warning("could not move old events of the run journal %s: %s", self.path, error)

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

    def _commit(
        self, db: sqlite3.Connection, entries: Sequence[JournalEntry], *, database: bool
    ) -> None:
        """Apply `entries`: their events appended to their segment first, while the process
        holds the journal alone, then the rest in the transaction begun on `db` (with
        `database`), committed."""
        try:
            segments = self._segments
            attempts = self._attempts
            if attempts is None or not all(e.run_id in attempts for e in entries):
                attempts = self._known_attempts(db, entries)
            appended: list[bytes] = []
            runs: list[str] = []
            for entry in entries:
                if entry.kind not in ("begin", "resume") and entry.attempt < attempts.get(
                    entry.run_id, 0
                ):
                    continue  # written by an owner the run has since been taken from
                if entry.kind == "resume":
                    attempts[entry.run_id] = max(attempts.get(entry.run_id, 0), entry.attempt)
                if segments is not None and entry.kind == "event":
                    appended.append(record(entry.run_id.encode(), int(entry.key), entry.data))
                    runs.append(entry.run_id)
                elif entry.kind == "end" and segments is not None:
                    self._apply(db, entry)
                    segments.forget(entry.run_id)
                else:
                    self._apply(db, entry)
            if appended and segments is not None:
                began = segments.append(b"".join(appended), runs)
                if began is not None:
                    self._thread.submit(self._settle)
            if database:
                db.execute("COMMIT")
        except BaseException:
            if database:
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
        return [str(run_id) for (run_id,) in rows if run_id not in self._unkept]

    async def load(self, run_id: str) -> JournaledRun | None:
        return await self._run(self._load, run_id)

    def _load(self, run_id: str) -> JournaledRun | None:
        if run_id in self._unkept:
            return None  # ended: its rows wait for the next sweep
        db = self._database()
        row = db.execute(
            "SELECT chat_id, record, attempts FROM journal_runs WHERE run_id = ?", (run_id,)
        ).fetchone()
        if row is None:
            return None
        journaled = JournaledRun(run_id, row[0], json.loads(row[1]), attempts=int(row[2]))
        logged = dict(
            db.execute(
                "SELECT seq, event FROM journal_events WHERE run_id = ? ORDER BY seq", (run_id,)
            ).fetchall()
        )
        segments = self._segments
        since = segments.holds(run_id) if segments is not None else None
        if segments is not None and since is not None:
            logged.update(segments.read(run_id, since))
        journaled.events.extend(pb.Event.FromString(logged[seq]) for seq in sorted(logged))
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
        if self._sweeping is not None:
            self._sweeping.cancel()
            self._sweeping = None
        if self._now is not None:
            self._now.close()
            self._now = None
        if self._segments is not None:
            self._segments.close()
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
