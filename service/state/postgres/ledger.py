"""The PostgreSQL `SpendLedger`: what model calls used, shared by every replica.

Table `spend_ledger` (`migrations/0011_spend_ledger.sql`): a row per (UTC day, tenant,
API key, agent, model); each `add` is one statement of upserts that add to the rows, so
replicas adding at once lose nothing.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from service.core.values import SpendEntry
from service.state.postgres.schema import DEFAULT_TIMEOUT_S, PooledStore

_ADD = """
INSERT INTO spend_ledger AS s
SELECT * FROM unnest($1::date[], $2::text[], $3::text[], $4::text[], $5::text[],
                     $6::bigint[], $7::bigint[], $8::bigint[], $9::float8[])
ON CONFLICT (tenant, day, api_key, agent_key, model) DO UPDATE SET
    calls = s.calls + EXCLUDED.calls,
    prompt_tokens = s.prompt_tokens + EXCLUDED.prompt_tokens,
    completion_tokens = s.completion_tokens + EXCLUDED.completion_tokens,
    cost = s.cost + EXCLUDED.cost
"""

_READ = """
SELECT day, tenant, api_key, agent_key, model, calls, prompt_tokens, completion_tokens, cost
FROM spend_ledger
WHERE day BETWEEN $1 AND $2 AND ($3::text IS NULL OR tenant = $3)
ORDER BY day, tenant, api_key, agent_key, model
"""


class PostgresSpendLedger(PooledStore):
    """The spend ledger in PostgreSQL (with `AGW_CHAT_STORE=postgres`, or `AGW_SPEND_LEDGER`)."""

    what = "spend ledger"

    def __init__(
        self, dsn: str, *, pool_size: int = 2, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        super().__init__(dsn, pool_size=pool_size, timeout_s=timeout_s)

    async def add(self, entries: Sequence[SpendEntry]) -> None:
        if not entries:
            return
        columns = [
            [datetime.date.fromisoformat(e.day) for e in entries],
            [e.tenant for e in entries],
            [e.key for e in entries],
            [e.agent_key for e in entries],
            [e.model for e in entries],
            [e.calls for e in entries],
            [e.prompt_tokens for e in entries],
            [e.completion_tokens for e in entries],
            [e.cost for e in entries],
        ]
        async with self.connection("could not add to the spend ledger") as db:
            await db.execute(_ADD, *columns)

    async def read(self, tenant: str | None, first_day: str, last_day: str) -> list[SpendEntry]:
        first, last = datetime.date.fromisoformat(first_day), datetime.date.fromisoformat(last_day)
        async with self.connection("could not read the spend ledger") as db:
            rows = await db.fetch(_READ, first, last, tenant)
        return [
            SpendEntry(
                row["day"].isoformat(),
                row["tenant"],
                row["api_key"],
                row["agent_key"],
                row["model"],
                row["calls"],
                row["prompt_tokens"],
                row["completion_tokens"],
                row["cost"],
            )
            for row in rows
        ]
