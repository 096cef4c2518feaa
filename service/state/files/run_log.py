"""The file `RunLog`: event logs of ended runs on disk, to re-attach after a run left the process.

Every run's complete log is kept, as length-delimited `agw.v1.Event` messages
(`service/state/framing.py`), in one SQLite database, `{dir}/runs.sqlite3` (a
row per run, written once when the run ends, in one transaction: a reader never
sees half a log). One database rather than a file per run: creating a file
allocates an inode, which on a file system that has seen many deletions costs
the kernel more than the whole insert (~0.3 ms against ~0.07 ms of CPU here),
and a week of runs is one file to back up instead of a directory of many. Rows
older than the archive's time-to-live are pruned at start-up and then hourly.
The database is in WAL mode with `synchronous=NORMAL`: a crash of the process
loses nothing written, a power cut at most the last runs' logs (as the page
cache would).

A log that cannot be kept fails with `StoreFailed`: a full disk fails that
insert alone (SQLite rolls it back; the logs kept before stay whole, and later
ones are kept once there is room); an I/O error (a failed fsync among them)
makes the run log refuse every later save, since a file after a failed fsync
is not to be trusted (the PostgreSQL "fsyncgate" lesson).

Every statement runs in the disk writer's thread (`writer.py`, shared with the
chat store), so the event loop never waits for the disk and statements never
overlap. The logs of the runs ending together are inserted in one transaction
(one commit for many runs); when it fails, every run of it fails alike and none
of its rows is kept. A log given as the bytes its run's journal wrote
(`Serialized`) is not serialised again. Logs kept by earlier versions as
`{dir}/{runId}.events` files are moved into the database at start-up.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from service.core.errors import StoreFailed
from service.core.events import Event
from service.core.ids import valid_run_id
from service.state.files.writer import DiskWriter
from service.state.framing import decode_events, encode_events

log = logging.getLogger("agw.store")

T = TypeVar("T")

DATABASE = "runs.sqlite3"
PRUNE_EVERY_S = 3600.0
IMPORT_BATCH = 1000  # files moved into the database per transaction
SQLITE_IOERR = 10  # the primary result code of SQLite's I/O errors (a failed fsync among them)
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS run_logs ("
    " run_id TEXT PRIMARY KEY, saved_at REAL NOT NULL, events BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS run_logs_saved_at ON run_logs (saved_at)",
)


class FileRunLog:
    """Keeps and reads the event logs of ended runs in `{directory}/runs.sqlite3`."""

    def __init__(self, directory: Path, ttl_s: float, *, writer: DiskWriter | None = None) -> None:
        self.directory = directory
        self.ttl_s = ttl_s
        self._last_prune = 0.0
        self._failed = ""  # why it keeps no more runs (an I/O error: never trusted again)
        self._db: sqlite3.Connection | None = None
        self._writer = writer if writer is not None else DiskWriter(name="agw-run-log")

    @property
    def path(self) -> Path:
        return self.directory / DATABASE

    async def _run(self, func: Callable[..., T], *args: object) -> T:
        return await self._writer.call(self, func, *args, urgent=True)

    async def open(self) -> None:
        await self._run(self._open)

    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA busy_timeout = 5000")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            for statement in SCHEMA:
                db.execute(statement)
        except sqlite3.Error as error:
            db.close()
            raise RuntimeError(f"cannot use the run log {self.path}: {error}") from error
        self._db = db
        self._import_files()
        self.prune()

    def _import_files(self) -> None:
        """Move the logs kept as one file per run (earlier versions) into the database: a
        thousand per transaction, each batch's files deleted once it is committed (a crash
        in between imports them again, to the same rows)."""
        assert self._db is not None, "the run log is not open"
        paths = sorted(self.directory.glob("*.events"))
        for start in range(0, len(paths), IMPORT_BATCH):
            batch = paths[start : start + IMPORT_BATCH]
            with self._db:  # one transaction
                self._db.execute("BEGIN")
                for path in batch:
                    if valid_run_id(path.stem):
                        with contextlib.suppress(FileNotFoundError):
                            saved_at = path.stat().st_mtime
                            self._insert(path.stem, saved_at, path.read_bytes())
            for path in batch:
                path.unlink(missing_ok=True)
        for path in self.directory.glob("*.tmp"):  # a write cut short
            path.unlink(missing_ok=True)
        if paths:
            log.info("moved %d run logs from files into %s", len(paths), self.path)

    def _insert(self, run_id: str, saved_at: float, data: bytes) -> None:
        assert self._db is not None, "the run log is not open"
        self._db.execute(
            "INSERT OR REPLACE INTO run_logs (run_id, saved_at, events) VALUES (?, ?, ?)",
            (run_id, saved_at, data),
        )

    async def save(self, run_id: str, events: Sequence[Event]) -> None:
        if not valid_run_id(run_id):
            return
        if self._failed:  # no need to go to the thread to learn it
            raise StoreFailed(f"the run log {self.path} is read-only after {self._failed}")
        await self._writer.group(self, self._save_all, (run_id, encode_events(events)))

    def _save_all(self, logs: list[tuple[str, bytes]]) -> None:
        """In the writer's thread: the logs of a batch of runs, in one transaction."""
        if self._failed:
            raise StoreFailed(f"the run log {self.path} is read-only after {self._failed}")
        assert self._db is not None, "the run log is not open"
        names = ", ".join(repr(run_id) for run_id, _ in logs[:3]) + (", …" if len(logs) > 3 else "")
        names = f"run {names}" if len(logs) == 1 else f"runs {names} (saved together)"
        saved_at = time.time()
        try:
            with self._db:  # one transaction: all of them or none
                self._db.execute("BEGIN")
                for run_id, data in logs:
                    self._insert(run_id, saved_at, data)
            if time.monotonic() - self._last_prune > PRUNE_EVERY_S:
                self.prune()
        except sqlite3.Error as error:
            if getattr(error, "sqlite_errorcode", 0) & 0xFF == SQLITE_IOERR:
                self._failed = f"an I/O error ({error})"
                log.error("the run log %s failed (%s): it keeps no more runs", self.path, error)
            raise StoreFailed(
                f"could not keep the log of {names} in {self.path}: {error}"
            ) from error

    async def load(self, run_id: str) -> list[Event] | None:
        """The run's events, or None when the run was never kept (or has expired)."""
        if not valid_run_id(run_id):
            return None
        try:
            data = await self._run(self._load, run_id)
        except sqlite3.Error as error:
            raise StoreFailed(f"could not read the log of run {run_id!r}: {error}") from error
        return None if data is None else decode_events(data)

    def _load(self, run_id: str) -> bytes | None:
        assert self._db is not None, "the run log is not open"
        row = self._db.execute(
            "SELECT events FROM run_logs WHERE run_id = ? AND saved_at >= ?",
            (run_id, time.time() - self.ttl_s),
        ).fetchone()
        return None if row is None else bytes(row[0])

    async def delete(self, run_ids: Sequence[str]) -> int:
        ids = [run_id for run_id in run_ids if valid_run_id(run_id)]
        if not ids:
            return 0
        try:
            return await self._run(self._delete, ids)
        except sqlite3.Error as error:
            raise StoreFailed(f"could not delete run logs from {self.path}: {error}") from error

    def _delete(self, run_ids: list[str]) -> int:
        assert self._db is not None, "the run log is not open"
        marks = ",".join("?" * len(run_ids))
        return int(
            self._db.execute(f"DELETE FROM run_logs WHERE run_id IN ({marks})", run_ids).rowcount
        )

    def prune(self) -> int:
        """Delete the logs older than the time-to-live; returns how many (in its thread)."""
        assert self._db is not None, "the run log is not open"
        self._last_prune = time.monotonic()
        removed = self._db.execute(
            "DELETE FROM run_logs WHERE saved_at < ?", (time.time() - self.ttl_s,)
        ).rowcount
        if removed:
            log.info("pruned %d archived run logs older than %.0fs", removed, self.ttl_s)
        return removed

    async def close(self) -> None:
        await self._writer.drain()
        if self._db is not None:
            await self._run(self._db.close)
            self._db = None
