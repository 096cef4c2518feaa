"""The PostgreSQL `ChatStore`: the chats that replicas share, the system of record.

Tables (`migrations/`): `chats` (the summary ListChats shows: owner, name, agent,
times, run count, and the next record's position) and `chat_records` (one row per
record, by position).

- **Appends** are one transaction per call: the chat's row is created or updated
  (which locks it, so appends to one chat from any replica take turns), then the
  call's records get the next positions. A call's records are all kept or, when
  the connection or the server dies first, none are. Within a process appends to
  a chat are also serialised in call order (a FIFO lock taken before the first
  await), as the recorder relies on.
- **Records** read back exactly as appended: they are stored as `json` text.
- **Ownership** is filtered in SQL: a page only ever holds the principal's chats.
- A committed transaction is durable (the server's `synchronous_commit`); `sync`
  has nothing left to do.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from typing import Any

from service.core.errors import ChatNotFound
from service.core.ids import ANONYMOUS, Principal, chat_name_of, check_chat_id, valid_chat_id
from service.core.values import ChatSummary, Record
from service.state.postgres.schema import DEFAULT_TIMEOUT_S, PooledStore

_APPEND_CHAT = """
INSERT INTO chats AS c (id, owner_tenant, owner_subject, name, agent_key,
                        created_at, updated_at, run_count, record_count)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (id) DO UPDATE SET
    name = COALESCE($10, c.name),
    updated_at = GREATEST(c.updated_at, EXCLUDED.updated_at),
    run_count = c.run_count + EXCLUDED.run_count,
    record_count = c.record_count + EXCLUDED.record_count
RETURNING c.record_count - $9
"""

_APPEND_RECORDS = """
INSERT INTO chat_records (chat_id, position, record)
SELECT $1, $2 + t.n - 1, t.record
FROM unnest($3::json[]) WITH ORDINALITY AS t(record, n)
"""

_SUMMARY_COLUMNS = (
    "id, name, agent_key, created_at, updated_at, run_count, owner_tenant, owner_subject"
)

_PAGE = f"""
SELECT {_SUMMARY_COLUMNS} FROM chats
WHERE owner_tenant = $1 AND owner_subject = $2
  AND ($3::bigint IS NULL OR updated_at < $3 OR (updated_at = $3 AND id > $4))
  AND ($6 = '' OR strpos(lower(name), lower($6)) > 0)
ORDER BY updated_at DESC, id
LIMIT $5
"""

_EXPIRED = f"""
SELECT {_SUMMARY_COLUMNS} FROM chats WHERE updated_at < $1 ORDER BY updated_at LIMIT $2
"""


def _summary(row: Any) -> ChatSummary:
    return ChatSummary(
        chat_id=row["id"],
        chat_name=row["name"],
        agent_key=row["agent_key"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        run_count=row["run_count"],
        owner=Principal(row["owner_tenant"], row["owner_subject"]),
    )


def _cursor(summary: ChatSummary) -> str:
    return f"{summary.updated_at}:{summary.chat_id}"


def _after(cursor: str) -> tuple[int | None, str]:
    """The position a cursor stands for; a cursor that is not ours starts at the top."""
    updated, _, chat_id = cursor.partition(":")
    if updated.isdigit() and len(updated) <= 19 and valid_chat_id(chat_id):
        return int(updated), chat_id
    return None, ""


class PostgresChatStore(PooledStore):
    """Chats and their records in PostgreSQL (`AGW_CHAT_STORE=postgres`)."""

    what = "chat store"

    def __init__(
        self, dsn: str, *, pool_size: int = 10, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        super().__init__(dsn, pool_size=pool_size, timeout_s=timeout_s)
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    async def append(self, chat_id: str, records: list[Record]) -> None:
        check_chat_id(chat_id)
        if not records:
            return
        # Everything the call needs is taken from the records now: the caller may change them.
        texts = [json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in records]
        first = records[0]
        query = first.get("query") or {}
        owner = Principal.from_record(first.get("owner"))
        times = [int(r.get("updatedAt") or 0) for r in records]
        queries = sum(1 for r in records if r.get("_type") == "query")
        renamed = [r["chatName"] for r in records if r.get("_type") == "update"]
        chat = (
            chat_id,
            owner.tenant,
            owner.subject,
            chat_name_of(str(query.get("message") or "")),
            str(query.get("agentKey") or ""),
            times[0],
            max(times),
            queries,
            len(texts),
            str(renamed[-1]) if renamed else None,
        )
        lock = self._locks.get(chat_id)
        if lock is None:
            lock = self._locks[chat_id] = asyncio.Lock()
        async with lock, self.connection(f"could not append to chat {chat_id!r}") as db:
            # Not `db.transaction()`: its rollback on a failure would wait for a server that
            # may not answer; a failed call closes the connection, which rolls it back.
            await db.execute("BEGIN")
            start = await db.fetchval(_APPEND_CHAT, *chat)
            await db.execute(_APPEND_RECORDS, chat_id, start, texts)
            await db.execute("COMMIT")

    async def read(self, chat_id: str) -> list[Record]:
        check_chat_id(chat_id)
        async with self.connection(f"could not read chat {chat_id!r}") as db:
            rows = await db.fetch(
                "SELECT record FROM chat_records WHERE chat_id = $1 ORDER BY position", chat_id
            )
        if not rows:
            raise ChatNotFound(f"no chat {chat_id!r}", chat_id=chat_id)
        return [json.loads(row["record"]) for row in rows]

    async def summary(self, chat_id: str) -> ChatSummary | None:
        async with self.connection(f"could not read chat {chat_id!r}") as db:
            row = await db.fetchrow(f"SELECT {_SUMMARY_COLUMNS} FROM chats WHERE id = $1", chat_id)
        return None if row is None else _summary(row)

    async def page(
        self, limit: int, cursor: str = "", *, owner: Principal = ANONYMOUS, name_contains: str = ""
    ) -> tuple[list[ChatSummary], str]:
        updated, chat_id = _after(cursor)
        async with self.connection("could not list chats") as db:
            rows = await db.fetch(
                _PAGE,
                owner.tenant,
                owner.subject,
                updated,
                chat_id,
                max(limit, 0) + 1,
                name_contains,
            )
        page = [_summary(row) for row in rows[:limit]]
        return page, _cursor(page[-1]) if page and len(rows) > limit else ""

    async def expired(self, before: int, limit: int) -> list[ChatSummary]:
        async with self.connection("could not list expired chats") as db:
            rows = await db.fetch(_EXPIRED, before, limit)
        return [_summary(row) for row in rows]

    async def delete(self, chat_id: str) -> bool:
        """Remove the chat's row; its records go with it (ON DELETE CASCADE)."""
        check_chat_id(chat_id)
        lock = self._locks.get(chat_id)
        if lock is None:
            lock = self._locks[chat_id] = asyncio.Lock()
        async with lock, self.connection(f"could not delete chat {chat_id!r}") as db:
            status = await db.execute("DELETE FROM chats WHERE id = $1", chat_id)
        return bool(status.endswith(" 1"))

    async def sync(self, chat_id: str) -> None:
        return None
