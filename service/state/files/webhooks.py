"""The file `WebhookStore`: the runs' webhooks and the queued notifications in SQLite.

`{dir}/webhooks.sqlite3` (beside the run log) holds each run's webhooks and each
notification not yet delivered, so that both outlive the process: a service started
again finds its queue as it was and sends what is due. The webhooks are also kept in
memory (one process owns the file), so that a run without any costs no statement. The
database is in WAL mode with `synchronous=NORMAL` (a killed process loses nothing
committed). A run's webhooks are forgotten `ttl_s` after they were added (at start-up).

One thread of its own runs every statement: the event loop never waits for the disk.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from service.core.errors import StoreFailed
from service.core.webhooks import Delivery, Webhook
from service.state.deliveries import Row, delivery_of, row_of
from service.state.files.sqlite import connect

T = TypeVar("T")

DATABASE = "webhooks.sqlite3"
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS webhooks ("
    " run_id TEXT NOT NULL, webhook_id TEXT NOT NULL, webhook TEXT NOT NULL,"
    " added_at REAL NOT NULL, PRIMARY KEY (run_id, webhook_id))",
    "CREATE TABLE IF NOT EXISTS deliveries ("
    " id TEXT PRIMARY KEY, webhook TEXT NOT NULL, notice TEXT NOT NULL,"
    " attempts INTEGER NOT NULL DEFAULT 0, next_at INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS deliveries_next_at ON deliveries (next_at)",
)


class FileWebhookStore:
    """Webhooks and notifications in `{directory}/webhooks.sqlite3`."""

    def __init__(self, directory: Path, ttl_s: float = 7 * 86400.0) -> None:
        self.directory = directory
        self.ttl_s = ttl_s
        self._db: sqlite3.Connection | None = None
        self._webhooks: dict[str, dict[str, Webhook]] = {}
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agw-webhooks")

    @property
    def path(self) -> Path:
        return self.directory / DATABASE

    async def _run(self, func: Callable[..., T], *args: object) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, func, *args)
        except sqlite3.Error as error:
            raise StoreFailed(f"the webhook store {self.path} failed: {error}") from error

    async def open(self) -> None:
        rows = await self._run(self._open)
        for row in rows:
            webhook = Webhook.from_record(json.loads(row))
            self._webhooks.setdefault(webhook.run_id, {})[webhook.webhook_id] = webhook

    def _open(self) -> list[str]:
        self.directory.mkdir(parents=True, exist_ok=True)
        db = connect(self.path)
        for statement in SCHEMA:
            db.execute(statement)
        db.execute("DELETE FROM webhooks WHERE added_at < ?", (time.time() - self.ttl_s,))
        self._db = db
        return [row[0] for row in db.execute("SELECT webhook FROM webhooks ORDER BY added_at")]

    async def close(self) -> None:
        if self._db is not None:
            await self._run(self._db.close)
            self._db = None
        self._thread.shutdown(wait=True)

    def _execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        assert self._db is not None, "the webhook store is not open"
        return self._db.execute(sql, args)

    async def add(self, webhook: Webhook) -> None:
        data = json.dumps(webhook.to_record())
        await self._run(
            self._execute,
            "INSERT OR REPLACE INTO webhooks (run_id, webhook_id, webhook, added_at)"
            " VALUES (?, ?, ?, ?)",
            webhook.run_id,
            webhook.webhook_id,
            data,
            time.time(),
        )
        self._webhooks.setdefault(webhook.run_id, {})[webhook.webhook_id] = webhook

    async def of_run(self, run_id: str) -> list[Webhook]:
        return list(self._webhooks.get(run_id, {}).values())

    async def remove(self, run_id: str, webhook_id: str) -> bool:
        if self._webhooks.get(run_id, {}).pop(webhook_id, None) is None:
            return False
        sql = "DELETE FROM webhooks WHERE run_id = ? AND webhook_id = ?"
        await self._run(self._execute, sql, run_id, webhook_id)
        return True

    async def enqueue(self, deliveries: Sequence[Delivery]) -> None:
        await self._run(self._insert, [row_of(d) for d in deliveries])

    def _insert(self, rows: list[Row]) -> None:
        assert self._db is not None, "the webhook store is not open"
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT OR IGNORE INTO deliveries (id, webhook, notice, attempts, next_at)"
                " VALUES (?, ?, ?, ?, ?)",
                rows,
            )

    async def due(self, now_ms: int, limit: int, lease_ms: int) -> list[Delivery]:
        rows = await self._run(self._take, now_ms, limit, lease_ms)
        return [delivery_of(*row) for row in rows]

    def _take(self, now_ms: int, limit: int, lease_ms: int) -> list[tuple[Any, ...]]:
        assert self._db is not None, "the webhook store is not open"
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            rows = self._db.execute(
                "SELECT id, webhook, notice, attempts, next_at FROM deliveries"
                " WHERE next_at <= ? ORDER BY next_at, id LIMIT ?",
                (now_ms, limit),
            ).fetchall()
            self._db.executemany(
                "UPDATE deliveries SET next_at = ? WHERE id = ?",
                [(now_ms + lease_ms, row[0]) for row in rows],
            )
        return rows

    async def next_due(self) -> int | None:
        row = await self._run(
            lambda: self._execute("SELECT min(next_at) FROM deliveries").fetchone()
        )
        return None if row is None or row[0] is None else int(row[0])

    async def delivered(self, delivery_id: str) -> None:
        await self._run(self._execute, "DELETE FROM deliveries WHERE id = ?", delivery_id)

    async def retry(self, delivery_id: str, attempts: int, next_at_ms: int) -> None:
        sql = "UPDATE deliveries SET attempts = ?, next_at = ? WHERE id = ?"
        await self._run(self._execute, sql, attempts, next_at_ms, delivery_id)
