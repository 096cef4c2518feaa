"""The run registry and the mailbox in PostgreSQL: live runs shared between replicas.

`RunRegistry` (table `runs`) says which replica owns each live run and until when:
the owner holds a *lease* that it renews, under a *fence token*. Every claim (a
new run, or taking over a run whose lease expired) takes a new token from one
sequence, so tokens only grow: a replica that lost its lease holds a smaller
token than the run's, and every fenced call it makes (renew, end, take, answer)
changes nothing. At most one run of a chat is running.

`Mailbox` (table `mailbox`) keeps the Submit and Cancel messages addressed to a
live run, from any replica, until its owner takes them; the owner answers each,
and the sender reads the answer. Messages are kept with their run, and go when
the registry forgets it.

Both take a pool from `pg_schema.open_pool` (one pool can serve both). Times are
the database server's, in seconds since the epoch, so replicas' clocks need not
agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from service.core.ids import Principal
from service.state.pg_schema import Pool, failures

RunStatus = Literal["running", "ended", "lost"]
MessageKind = Literal["submit", "cancel"]


@dataclass(frozen=True, slots=True)
class Lease:
    """A replica's hold on a run: good until `expires_at`, under `fence`."""

    run_id: str
    fence: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class RunEntry:
    """A run as the registry knows it."""

    run_id: str
    chat_id: str
    owner: Principal
    replica_id: str
    lease_expires_at: float
    fence: int
    status: RunStatus
    terminal: bytes | None  # the run's terminal agw.v1.Event, once it ended


@dataclass(frozen=True, slots=True)
class Message:
    """A Submit or a Cancel waiting for a run's owner."""

    id: int
    run_id: str
    kind: MessageKind
    payload: Any
    created_at: float


@dataclass(frozen=True, slots=True)
class Answer:
    """The owner's answer to a message."""

    value: Any
    answered_at: float


_RUN_COLUMNS = (
    "run_id, chat_id, owner_tenant, owner_subject, replica_id,"
    " extract(epoch FROM lease_expires_at)::float8 AS lease_expires_at, fence, status, terminal"
)
_LEASE = "run_id, fence, extract(epoch FROM lease_expires_at)::float8 AS expires_at"
_UNTIL = "now() + make_interval(secs => $3)"


def _lease(row: Any) -> Lease | None:
    return None if row is None else Lease(row["run_id"], row["fence"], row["expires_at"])


def _entry(row: Any) -> RunEntry:
    return RunEntry(
        run_id=row["run_id"],
        chat_id=row["chat_id"],
        owner=Principal(row["owner_tenant"], row["owner_subject"]),
        replica_id=row["replica_id"],
        lease_expires_at=row["lease_expires_at"],
        fence=row["fence"],
        status=row["status"],
        terminal=row["terminal"],
    )


def _count(status: str) -> int:
    """The row count of a command status such as "UPDATE 3"."""
    return int(status.split()[-1])


class RunRegistry:
    """Which replica owns which live run, with leases and fence tokens."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def start(
        self, run_id: str, chat_id: str, owner: Principal, replica_id: str, lease_s: float
    ) -> Lease | None:
        """Register a new run owned by `replica_id`; None when the chat already has a
        running run (or the run id is taken)."""
        with failures(f"could not register run {run_id}"):
            row = await self.pool.fetchrow(
                "INSERT INTO runs (run_id, replica_id, lease_expires_at, chat_id,"
                " owner_tenant, owner_subject, fence)"
                f" VALUES ($1, $2, {_UNTIL}, $4, $5, $6, nextval('run_fences'))"
                f" ON CONFLICT DO NOTHING RETURNING {_LEASE}",
                run_id,
                replica_id,
                lease_s,
                chat_id,
                owner.tenant,
                owner.subject,
            )
        return _lease(row)

    async def take_over(self, run_id: str, replica_id: str, lease_s: float) -> Lease | None:
        """Claim a running run whose lease expired, under a new fence token; None when
        its lease is still good or it is not running."""
        with failures(f"could not take over run {run_id}"):
            row = await self.pool.fetchrow(
                f"UPDATE runs SET replica_id = $2, lease_expires_at = {_UNTIL},"
                " fence = nextval('run_fences')"
                " WHERE run_id = $1 AND status = 'running' AND lease_expires_at <= now()"
                f" RETURNING {_LEASE}",
                run_id,
                replica_id,
                lease_s,
            )
        return _lease(row)

    async def renew(self, run_id: str, fence: int, lease_s: float) -> Lease | None:
        """Extend the lease held under `fence`; None when fenced out or the run ended."""
        with failures(f"could not renew the lease of run {run_id}"):
            row = await self.pool.fetchrow(
                f"UPDATE runs SET lease_expires_at = {_UNTIL}"
                " WHERE run_id = $1 AND fence = $2 AND status = 'running'"
                f" RETURNING {_LEASE}",
                run_id,
                fence,
                lease_s,
            )
        return _lease(row)

    async def end(
        self, run_id: str, fence: int, terminal: bytes, status: RunStatus = "ended"
    ) -> bool:
        """Mark the run ended (or `lost`) with its terminal event; False when fenced out
        or already ended. The chat is free from then on."""
        with failures(f"could not end run {run_id}"):
            done = await self.pool.execute(
                "UPDATE runs SET status = $3, terminal = $4, ended_at = now()"
                " WHERE run_id = $1 AND fence = $2 AND status = 'running'",
                run_id,
                fence,
                status,
                terminal,
            )
        return _count(done) == 1

    async def get(self, run_id: str) -> RunEntry | None:
        with failures(f"could not read run {run_id}"):
            row = await self.pool.fetchrow(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = $1", run_id
            )
        return None if row is None else _entry(row)

    async def running_of(self, chat_id: str) -> RunEntry | None:
        """The chat's running run, if any."""
        with failures(f"could not read the runs of chat {chat_id!r}"):
            row = await self.pool.fetchrow(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE chat_id = $1 AND status = 'running'",
                chat_id,
            )
        return None if row is None else _entry(row)

    async def expired(self, limit: int = 100) -> list[RunEntry]:
        """Running runs whose lease expired, the longest expired first."""
        with failures("could not look for expired leases"):
            rows = await self.pool.fetch(
                f"SELECT {_RUN_COLUMNS} FROM runs"
                " WHERE status = 'running' AND lease_expires_at <= now()"
                " ORDER BY lease_expires_at LIMIT $1",
                limit,
            )
        return [_entry(row) for row in rows]

    async def forget(self, ended_before_s: float) -> int:
        """Delete the runs that ended more than `ended_before_s` ago, and their messages."""
        with failures("could not forget ended runs"):
            done = await self.pool.execute(
                "DELETE FROM runs WHERE status <> 'running'"
                " AND ended_at <= now() - make_interval(secs => $1)",
                ended_before_s,
            )
        return _count(done)


class Mailbox:
    """Submit and Cancel messages for live runs, delivered to their owners."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def post(self, run_id: str, kind: MessageKind, payload: Any) -> int | None:
        """Leave a message for a running run; its id, or None when the run is not running.

        The run's row is share-locked meanwhile, so a message is never left behind by
        a run that ends at the same moment: it is either refused here or answered by
        the owner's `answer_all` after the run ended.
        """
        with failures(f"could not post to run {run_id}"):
            message_id: int | None = await self.pool.fetchval(
                "INSERT INTO mailbox (run_id, kind, payload)"
                " SELECT run_id, $2, $3::json FROM runs"
                " WHERE run_id = $1 AND status = 'running' FOR SHARE"
                " RETURNING id",
                run_id,
                kind,
                json.dumps(payload, ensure_ascii=False),
            )
        return message_id

    async def take(self, run_id: str, fence: int) -> list[Message]:
        """The run's undelivered messages, in the order they were posted, now delivered;
        none when `fence` is not the run's."""
        with failures(f"could not take the messages of run {run_id}"):
            rows = await self.pool.fetch(
                "UPDATE mailbox m SET delivered_at = now() FROM runs r"
                " WHERE m.run_id = $1 AND m.delivered_at IS NULL"
                " AND r.run_id = m.run_id AND r.fence = $2 AND r.status = 'running'"
                " RETURNING m.id, m.run_id, m.kind, m.payload,"
                " extract(epoch FROM m.created_at)::float8 AS created_at",
                run_id,
                fence,
            )
        messages = [
            Message(
                id=row["id"],
                run_id=row["run_id"],
                kind=row["kind"],
                payload=json.loads(row["payload"]),
                created_at=row["created_at"],
            )
            for row in rows
        ]
        return sorted(messages, key=lambda m: m.id)

    async def answer(self, message_id: int, fence: int, value: Any) -> bool:
        """Answer a message as the owner of its run (under `fence`); False when fenced out
        or already answered."""
        with failures(f"could not answer message {message_id}"):
            done = await self.pool.execute(
                "UPDATE mailbox m SET answer = $3::json, answered_at = now() FROM runs r"
                " WHERE m.id = $1 AND m.answered_at IS NULL"
                " AND r.run_id = m.run_id AND r.fence = $2",
                message_id,
                fence,
                json.dumps(value, ensure_ascii=False),
            )
        return _count(done) == 1

    async def answer_all(self, run_id: str, fence: int, value: Any) -> list[int]:
        """Answer every message of the run not answered yet (delivered or not), e.g. once
        it ended; the ids answered, in order."""
        with failures(f"could not answer the messages of run {run_id}"):
            rows = await self.pool.fetch(
                "UPDATE mailbox m SET answer = $3::json, answered_at = now(),"
                " delivered_at = coalesce(m.delivered_at, now()) FROM runs r"
                " WHERE m.run_id = $1 AND m.answered_at IS NULL"
                " AND r.run_id = m.run_id AND r.fence = $2"
                " RETURNING m.id",
                run_id,
                fence,
                json.dumps(value, ensure_ascii=False),
            )
        return sorted(row["id"] for row in rows)

    async def answer_of(self, message_id: int) -> Answer | None:
        """The answer to a message; None while it has none (or there is no such message)."""
        with failures(f"could not read message {message_id}"):
            row = await self.pool.fetchrow(
                "SELECT answer, extract(epoch FROM answered_at)::float8 AS answered_at"
                " FROM mailbox WHERE id = $1 AND answered_at IS NOT NULL",
                message_id,
            )
        return None if row is None else Answer(json.loads(row["answer"]), row["answered_at"])
