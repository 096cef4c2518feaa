"""The file `SpendLedger`: what model calls used, in one SQLite database beside the run log.

`{dir}/spend.sqlite3` holds a row per (UTC day, tenant, API key, agent, model) with its
calls, tokens and cost. Every statement runs in the disk writer's thread (`writer.py`,
shared with the chat store and the run log), so the event loop never waits for the
disk; the `add`s of the runs ending together are one transaction of upserts.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from service.core.errors import StoreFailed
from service.core.values import SpendEntry
from service.state.files.writer import DiskWriter

T = TypeVar("T")

DATABASE = "spend.sqlite3"
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS spend ("
    " day TEXT NOT NULL, tenant TEXT NOT NULL, api_key TEXT NOT NULL, agent_key TEXT NOT NULL,"
    " model TEXT NOT NULL, calls INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL,"
    " completion_tokens INTEGER NOT NULL, cost REAL NOT NULL,"
    " PRIMARY KEY (day, tenant, api_key, agent_key, model)) WITHOUT ROWID",
)
UPSERT = (
    "INSERT INTO spend VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (day, tenant, api_key, agent_key, model) DO UPDATE SET"
    " calls = calls + excluded.calls, prompt_tokens = prompt_tokens + excluded.prompt_tokens,"
    " completion_tokens = completion_tokens + excluded.completion_tokens,"
    " cost = cost + excluded.cost"
)
SELECT = (
    "SELECT day, tenant, api_key, agent_key, model, calls, prompt_tokens, completion_tokens,"
    " cost FROM spend WHERE day BETWEEN ? AND ? AND (? IS NULL OR tenant = ?)"
    " ORDER BY day, tenant, api_key, agent_key, model"
)


class FileSpendLedger:
    """The spend ledger in `{directory}/spend.sqlite3`."""

    def __init__(self, directory: Path, *, writer: DiskWriter | None = None) -> None:
        self.directory = directory
        self._db: sqlite3.Connection | None = None
        self._writer = writer if writer is not None else DiskWriter(name="agw-ledger")

    @property
    def path(self) -> Path:
        return self.directory / DATABASE

    async def _run(self, func: Callable[..., T], *args: object) -> T:
        try:
            return await self._writer.call(self, func, *args, urgent=True)
        except sqlite3.Error as error:
            raise StoreFailed(f"the spend ledger {self.path}: {error}") from error

    async def open(self) -> None:
        await self._run(self._open)

    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA busy_timeout = 5000")
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        for statement in SCHEMA:
            db.execute(statement)
        self._db = db

    async def add(self, entries: Sequence[SpendEntry]) -> None:
        rows: list[tuple[object, ...]] = [
            (*e.where, e.calls, e.prompt_tokens, e.completion_tokens, e.cost) for e in entries
        ]
        try:
            await self._writer.group(self, self._add, rows)
        except sqlite3.Error as error:
            raise StoreFailed(f"the spend ledger {self.path}: {error}") from error

    def _add(self, batches: list[list[tuple[object, ...]]]) -> None:
        assert self._db is not None, "the spend ledger is not open"
        with self._db:
            self._db.execute("BEGIN")
            for rows in batches:
                self._db.executemany(UPSERT, rows)

    async def read(self, tenant: str | None, first_day: str, last_day: str) -> list[SpendEntry]:
        rows = await self._run(self._read, (first_day, last_day, tenant, tenant))
        return [SpendEntry(*row) for row in rows]

    def _read(self, arguments: tuple[object, ...]) -> list[Any]:
        assert self._db is not None, "the spend ledger is not open"
        return list(self._db.execute(SELECT, arguments).fetchall())

    async def close(self) -> None:
        if self._db is not None:
            await self._writer.drain()
            await self._run(self._db.close)
            self._db = None
