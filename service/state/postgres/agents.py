"""The PostgreSQL `AgentStore`: agents' versions shared by every replica, and their changes.

Table `agent_versions` (`migrations/0012_agent_store.sql`). A write takes the key's
transaction-scoped advisory lock, reads the key's newest version, checks the expected one
and inserts the next, and notifies channel `agw_agents` with the key, all in one
transaction: the notification is delivered when it commits. Each replica listens on a
connection of its own (`LISTEN agw_agents`) and hears every key written, its own writes
included; a listener connection that broke is made again at the next `current()`
(the catalog's periodic reading), which also catches up with what was missed meanwhile.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import asyncpg

from service.core.agents.store import AgentChange, StoredAgent
from service.state.postgres.schema import DEFAULT_TIMEOUT_S, PooledStore, failures

log = logging.getLogger("agw.store")

CHANNEL = "agw_agents"

_COLUMNS = "agent_key, version, definition, created_at, created_by, change, source_version, comment"

_INSERT = f"""
INSERT INTO agent_versions ({_COLUMNS}) VALUES ($1, $2, $3::json, $4, $5, $6, $7, $8)
"""


def _stored(row: Any) -> StoredAgent:
    return StoredAgent(
        row["agent_key"],
        row["version"],
        json.loads(row["definition"]),
        row["created_at"],
        row["created_by"],
        row["change"],
        row["source_version"],
        row["comment"],
    )


class PostgresAgentStore(PooledStore):
    """Agents' versions in PostgreSQL (`AGW_AGENT_STORE=postgres`)."""

    what = "agent store"

    def __init__(
        self, dsn: str, *, pool_size: int = 2, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        super().__init__(dsn, pool_size=pool_size, timeout_s=timeout_s)
        self._listeners: list[Callable[[str], None]] = []
        self._listening: Any = None  # the connection that LISTENs

    async def open(self) -> None:
        await super().open()
        await self._listen()

    async def close(self) -> None:
        listening, self._listening = self._listening, None
        if listening is not None:
            listening.terminate()
        await super().close()

    def subscribe(self, changed: Callable[[str], None]) -> None:
        self._listeners.append(changed)

    async def _listen(self) -> None:
        with failures("could not listen to the agent store's changes"):
            connection = await asyncpg.connect(self.dsn, timeout=self.timeout_s)
            await connection.add_listener(CHANNEL, self._notified)
        self._listening = connection

    def _notified(self, connection: Any, pid: int, channel: str, key: str) -> None:
        for listener in self._listeners:
            listener(key)

    async def put(
        self,
        key: str,
        definition: dict[str, Any],
        *,
        change: AgentChange,
        created_by: str,
        expected: int | None,
        source_version: int = 0,
        comment: str = "",
    ) -> StoredAgent | int:
        text = json.dumps(definition, ensure_ascii=False, separators=(",", ":"))
        now = time.time_ns() // 1_000_000
        async with self.connection(f"could not write agent {key!r}") as db:
            await db.execute("BEGIN")
            await db.execute("SELECT pg_advisory_xact_lock(hashtext('agw agent ' || $1))", key)
            current = await db.fetchval(
                "SELECT COALESCE(MAX(version), 0) FROM agent_versions WHERE agent_key = $1", key
            )
            if expected is not None and expected != current:
                await db.execute("ROLLBACK")
                return int(current)
            values = (key, current + 1, text, now, created_by, change, source_version, comment)
            await db.execute(_INSERT, *values)
            await db.execute("SELECT pg_notify($1, $2)", CHANNEL, key)
            await db.execute("COMMIT")
        return StoredAgent(
            key, current + 1, definition, now, created_by, change, source_version, comment
        )

    async def current(self) -> dict[str, StoredAgent]:
        if self._listening is None or self._listening.is_closed():
            try:
                await self._listen()
            except Exception:
                log.warning("could not listen to the agent store's changes; reading them")
        async with self.connection("could not read the agent store") as db:
            rows = await db.fetch(
                f"SELECT DISTINCT ON (agent_key) {_COLUMNS} FROM agent_versions"
                " ORDER BY agent_key, version DESC"
            )
        return {row["agent_key"]: _stored(row) for row in rows}

    async def history(self, key: str) -> list[StoredAgent]:
        async with self.connection(f"could not read agent {key!r}") as db:
            rows = await db.fetch(
                f"SELECT {_COLUMNS} FROM agent_versions WHERE agent_key = $1 ORDER BY version DESC",
                key,
            )
        return [_stored(row) for row in rows]
