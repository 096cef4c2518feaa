"""The PostgreSQL `RunJournal`: the journals of the runs in flight, shared by the replicas.

Tables `journal_runs`, `journal_events` and `journal_steps` (`migrations/`): per run
begun and not yet kept, what it started with, its events and its steps' results
(service/core/run/journal.py). Each batch of entries is one transaction, so another
replica that resumes a run whose owner was lost reads a prefix of what that owner
journaled, in order. When a run is kept (its log in `run_logs`), its rows are deleted.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agw.v1 import events_pb2 as pb

from service.core.run.journal import JournaledRun, JournalEntry
from service.state.postgres.schema import DEFAULT_TIMEOUT_S, PooledStore


class PostgresRunJournal(PooledStore):
    """The journals of the runs in flight in PostgreSQL (`AGW_RUN_JOURNAL=postgres`)."""

    what = "run journal"

    def __init__(
        self, dsn: str, *, pool_size: int = 4, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        super().__init__(dsn, pool_size=pool_size, timeout_s=timeout_s)

    async def write(self, entries: Sequence[JournalEntry]) -> None:
        if all(entry.kind == "event" for entry in entries):
            await self._write_events(entries)
            return
        events: list[tuple[str, int, bytes]] = []
        async with (
            self.connection("could not write the runs' journal") as db,
            db.transaction(),
        ):
            run_ids = sorted({e.run_id for e in entries if e.kind != "begin"})
            rows = await db.fetch(
                "SELECT run_id, attempts FROM journal_runs WHERE run_id = ANY($1::text[])"
                " FOR UPDATE",
                run_ids,
            )
            attempts = {row["run_id"]: row["attempts"] for row in rows}
            for entry in entries:
                if entry.kind not in ("begin", "resume") and entry.attempt < attempts.get(
                    entry.run_id, 0
                ):
                    continue  # written by an owner the run has since been taken from
                if entry.kind == "resume":
                    attempts[entry.run_id] = max(attempts.get(entry.run_id, 0), entry.attempt)
                if entry.kind == "event":  # many at once: gathered, written together
                    events.append((entry.run_id, int(entry.key), entry.data))
                    continue
                if events:
                    await _write_events(db, events)
                    events = []
                await _apply(db, entry)
            if events:
                await _write_events(db, events)

    async def _write_events(self, entries: Sequence[JournalEntry]) -> None:
        """A batch of events alone (most batches: deltas), in one statement, one round
        trip: each event kept unless its run has resumed since its owner wrote it — the
        run's row is locked (`FOR SHARE`) as `write` locks it, so a resumption waits for
        the batch, or the batch sees it. Written on the store's kept connection, as a
        batch follows another on every turn of the event loop while runs stream."""
        async with self.kept_connection("could not write the runs' journal") as db:
            await db.execute(
                "INSERT INTO journal_events (run_id, seq, event)"
                " SELECT e.run_id, e.seq, e.event"
                " FROM unnest($1::text[], $2::int[], $3::bytea[], $4::int[])"
                "  AS e(run_id, seq, event, attempt)"
                " JOIN journal_runs r ON r.run_id = e.run_id AND e.attempt >= r.attempts"
                " WHERE r.run_id = ANY($1)"  # by the primary key, not a scan of every run
                " ORDER BY e.run_id, e.seq"
                " FOR SHARE OF r"
                " ON CONFLICT (run_id, seq) DO UPDATE SET event = EXCLUDED.event",
                [e.run_id for e in entries],
                [int(e.key) for e in entries],
                [e.data for e in entries],
                [e.attempt for e in entries],
            )

    def write_now(self, entries: Sequence[JournalEntry]) -> bool:
        return False  # a round trip to the database: written by `write`

    async def unfinished(self) -> list[str]:
        async with self.connection("could not read the runs' journal") as db:
            rows = await db.fetch("SELECT run_id FROM journal_runs ORDER BY begun_at, run_id")
        return [str(row["run_id"]) for row in rows]

    async def load(self, run_id: str) -> JournaledRun | None:
        async with self.connection(f"could not read the journal of run {run_id}") as db:
            row = await db.fetchrow(
                "SELECT chat_id, record, attempts FROM journal_runs WHERE run_id = $1", run_id
            )
            if row is None:
                return None
            journaled = JournaledRun(
                run_id, row["chat_id"], json.loads(row["record"]), attempts=row["attempts"]
            )
            for event in await db.fetch(
                "SELECT event FROM journal_events WHERE run_id = $1 ORDER BY seq", run_id
            ):
                journaled.events.append(pb.Event.FromString(event["event"]))
            for step in await db.fetch(
                "SELECT key, result FROM journal_steps WHERE run_id = $1 ORDER BY position",
                run_id,
            ):
                if step["result"] is None:
                    journaled.started.add(step["key"])
                else:
                    journaled.steps[step["key"]] = json.loads(step["result"])
        return journaled


async def _write_events(db: Any, events: list[tuple[str, int, bytes]]) -> None:
    await db.executemany(
        "INSERT INTO journal_events (run_id, seq, event) VALUES ($1, $2, $3)"
        " ON CONFLICT (run_id, seq) DO UPDATE SET event = EXCLUDED.event",
        events,
    )


async def _apply(db: Any, entry: JournalEntry) -> None:
    run_id = entry.run_id
    if entry.kind == "start":
        await db.execute(
            "INSERT INTO journal_steps (run_id, key) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            run_id,
            entry.key,
        )
    elif entry.kind == "step":
        await db.execute(
            "INSERT INTO journal_steps (run_id, key, result) VALUES ($1, $2, $3::jsonb)"
            " ON CONFLICT (run_id, key) DO UPDATE SET result = EXCLUDED.result",
            run_id,
            entry.key,
            entry.data.decode(),
        )
    elif entry.kind == "begin":
        await db.execute(
            "INSERT INTO journal_runs (run_id, chat_id, record) VALUES ($1, $2, $3::jsonb)"
            " ON CONFLICT (run_id) DO UPDATE SET record = EXCLUDED.record",
            run_id,
            entry.key,
            entry.data.decode(),
        )
    elif entry.kind == "resume":
        await db.execute(
            "UPDATE journal_runs SET attempts = GREATEST(attempts, $2) WHERE run_id = $1",
            run_id,
            int(entry.key),
        )
    elif entry.kind == "end":
        for table in ("journal_runs", "journal_events", "journal_steps"):
            await db.execute(f"DELETE FROM {table} WHERE run_id = $1", run_id)
