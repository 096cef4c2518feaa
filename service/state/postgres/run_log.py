"""The PostgreSQL `RunLog`: the event logs of ended runs, for re-attaching from any replica.

Table `run_logs` (`migrations/`): a run's log is written once when the run ends, as
length-delimited `agw.v1.Event` messages (`service/state/framing.py`, as the file
run log keeps them), and expires after the archive's time-to-live; expired rows are
never read, and are pruned at start-up and then hourly.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from service.core.events import Event
from service.core.ids import valid_run_id
from service.state.framing import decode_events, encode_events
from service.state.postgres.schema import DEFAULT_TIMEOUT_S, PooledStore

PRUNE_EVERY_S = 3600.0


class PostgresRunLog(PooledStore):
    """The event logs of ended runs in PostgreSQL (`AGW_RUN_LOG=postgres`)."""

    what = "run log"

    def __init__(
        self, dsn: str, ttl_s: float, *, pool_size: int = 4, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        super().__init__(dsn, pool_size=pool_size, timeout_s=timeout_s)
        self.ttl_s = ttl_s
        self._last_prune = 0.0

    async def open(self) -> None:
        await super().open()
        await self.prune()

    async def save(self, run_id: str, events: Sequence[Event]) -> None:
        if not valid_run_id(run_id):
            return
        chat_id = events[0].chat_id if events else ""
        async with self.connection(f"could not keep the log of run {run_id}") as db:
            await db.execute(
                "INSERT INTO run_logs (run_id, chat_id, events, expires_at)"
                " VALUES ($1, $2, $3, now() + make_interval(secs => $4))"
                " ON CONFLICT (run_id) DO UPDATE SET events = EXCLUDED.events,"
                " saved_at = now(), expires_at = EXCLUDED.expires_at",
                run_id,
                chat_id,
                encode_events(events),
                self.ttl_s,
            )
        if time.monotonic() - self._last_prune > PRUNE_EVERY_S:
            await self.prune()

    async def load(self, run_id: str) -> list[Event] | None:
        if not valid_run_id(run_id):
            return None
        async with self.connection(f"could not read the log of run {run_id}") as db:
            data = await db.fetchval(
                "SELECT events FROM run_logs WHERE run_id = $1 AND expires_at > now()", run_id
            )
        return None if data is None else decode_events(data)

    async def delete(self, run_ids: Sequence[str]) -> int:
        ids = [run_id for run_id in run_ids if valid_run_id(run_id)]
        if not ids:
            return 0
        async with self.connection("could not delete run logs") as db:
            status = await db.execute("DELETE FROM run_logs WHERE run_id = ANY($1::text[])", ids)
        return int(status.split()[-1])

    async def prune(self) -> int:
        """Delete the logs past their time-to-live; how many."""
        self._last_prune = time.monotonic()
        async with self.connection("could not prune the run logs") as db:
            status = await db.execute("DELETE FROM run_logs WHERE expires_at <= now()")
        return int(status.split()[-1])
