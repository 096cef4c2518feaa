"""The PostgreSQL `WebhookStore`: the runs' webhooks and queued notifications, shared by
replicas (`migrations/0014_webhooks.sql`).

A webhook added through one replica is read by the replica that runs the run when the
run's task state changes; a notification is queued by that replica and sent by whichever
replica takes it first: `due` takes the rows due with `FOR UPDATE SKIP LOCKED` and moves
them a lease ahead in the same statement, so two senders never take the same one at once,
and one taken by a sender that dies is due again once the lease has passed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from service.core.webhooks import Delivery, Webhook
from service.state.deliveries import delivery_of, row_of
from service.state.postgres.schema import DEFAULT_TIMEOUT_S, PooledStore

_TAKE = """
WITH taken AS (
    SELECT id, next_at FROM webhook_deliveries WHERE next_at <= $2
    ORDER BY next_at, id LIMIT $1 FOR UPDATE SKIP LOCKED
)
UPDATE webhook_deliveries AS d SET next_at = $2 + $3 FROM taken WHERE d.id = taken.id
RETURNING d.id, d.webhook, d.notice, d.attempts, taken.next_at
"""


class PostgresWebhookStore(PooledStore):
    """Webhooks and notifications in PostgreSQL (with `AGW_CHAT_STORE=postgres`)."""

    what = "webhook store"

    def __init__(
        self,
        dsn: str,
        *,
        ttl_s: float = 7 * 86400.0,
        pool_size: int = 2,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        super().__init__(dsn, pool_size=pool_size, timeout_s=timeout_s)
        self.ttl_s = ttl_s

    async def open(self) -> None:
        await super().open()
        async with self.connection("could not prune the webhooks") as db:
            await db.execute(
                "DELETE FROM webhooks WHERE added_at < now() - make_interval(secs => $1)",
                self.ttl_s,
            )

    async def add(self, webhook: Webhook) -> None:
        async with self.connection(f"could not keep a webhook of run {webhook.run_id}") as db:
            await db.execute(
                "INSERT INTO webhooks (run_id, webhook_id, webhook) VALUES ($1, $2, $3)"
                " ON CONFLICT (run_id, webhook_id) DO UPDATE SET webhook = EXCLUDED.webhook",
                webhook.run_id,
                webhook.webhook_id,
                json.dumps(webhook.to_record()),
            )

    async def of_run(self, run_id: str) -> list[Webhook]:
        async with self.connection(f"could not read the webhooks of run {run_id}") as db:
            rows = await db.fetch(
                "SELECT webhook FROM webhooks WHERE run_id = $1 ORDER BY added_at", run_id
            )
        return [Webhook.from_record(json.loads(row["webhook"])) for row in rows]

    async def remove(self, run_id: str, webhook_id: str) -> bool:
        async with self.connection(f"could not remove a webhook of run {run_id}") as db:
            status = await db.execute(
                "DELETE FROM webhooks WHERE run_id = $1 AND webhook_id = $2", run_id, webhook_id
            )
        return bool(status != "DELETE 0")

    async def enqueue(self, deliveries: Sequence[Delivery]) -> None:
        async with self.connection("could not queue notifications") as db:
            await db.executemany(
                "INSERT INTO webhook_deliveries (id, webhook, notice, attempts, next_at)"
                " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING",
                [row_of(d) for d in deliveries],
            )

    async def due(self, now_ms: int, limit: int, lease_ms: int) -> list[Delivery]:
        async with self.connection("could not take the due notifications") as db:
            rows = await db.fetch(_TAKE, limit, now_ms, lease_ms)
        taken = [delivery_of(*row) for row in rows]
        return sorted(taken, key=lambda d: (d.next_at_ms, d.delivery_id))

    async def next_due(self) -> int | None:
        async with self.connection("could not read the notification queue") as db:
            value = await db.fetchval("SELECT min(next_at) FROM webhook_deliveries")
        return None if value is None else int(value)

    async def delivered(self, delivery_id: str) -> None:
        async with self.connection("could not forget a delivered notification") as db:
            await db.execute("DELETE FROM webhook_deliveries WHERE id = $1", delivery_id)

    async def retry(self, delivery_id: str, attempts: int, next_at_ms: int) -> None:
        async with self.connection("could not note a failed notification") as db:
            await db.execute(
                "UPDATE webhook_deliveries SET attempts = $2, next_at = $3 WHERE id = $1",
                delivery_id,
                attempts,
                next_at_ms,
            )
