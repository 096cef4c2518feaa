"""The file `SpendLedger`: what model calls used, in one SQLite database beside the run log.

`{dir}/spend.sqlite3` holds a row per (UTC day, tenant, API key, agent, model) with its
calls, tokens and cost; each `add` is one transaction of upserts. One thread of its own
runs every statement, so the event loop never waits for the disk.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from service.core.errors import StoreFailed
from service.core.values import SpendEntry

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

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._db: sqlite3.Connection | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agw-ledger")

    @property
    def path(self) -> Path:
        return self.directory / DATABASE

    async def _run(self, func: Callable[..., T], *args: object) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, func, *args)
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
        rows = [(*e.where, e.calls, e.prompt_tokens, e.completion_tokens, e.cost) for e in entries]
        await self._run(self._add, rows)

    def _add(self, rows: list[tuple[object, ...]]) -> None:
        assert self._db is not None, "the spend ledger is not open"
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(UPSERT, rows)

    async def read(self, tenant: str | None, first_day: str, last_day: str) -> list[SpendEntry]:
        rows = await self._run(self._read, (first_day, last_day, tenant, tenant))
        return [SpendEntry(*row) for row in rows]

    def _read(self, arguments: tuple[object, ...]) -> list[Any]:
        assert self._db is not None, "the spend ledger is not open"
        return list(self._db.execute(SELECT, arguments).fetchall())

    async def close(self) -> None:
        if self._db is not None:
            await self._run(self._db.close)
            self._db = None
        self._thread.shutdown(wait=True)
