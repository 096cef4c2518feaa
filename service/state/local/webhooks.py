"""The in-process `WebhookStore`: the runs' webhooks and the queued notifications in dicts.

Nothing survives the process (use the `files` or `postgres` store for that): for tests,
and for a replica that keeps no state of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from service.core.webhooks import Delivery, Webhook


class LocalWebhookStore:
    """Webhooks and notifications in dicts."""

    def __init__(self) -> None:
        self._webhooks: dict[str, dict[str, Webhook]] = {}  # run id → webhook id → webhook
        self._queue: dict[str, Delivery] = {}

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def add(self, webhook: Webhook) -> None:
        self._webhooks.setdefault(webhook.run_id, {})[webhook.webhook_id] = webhook

    async def of_run(self, run_id: str) -> list[Webhook]:
        return list(self._webhooks.get(run_id, {}).values())

    async def remove(self, run_id: str, webhook_id: str) -> bool:
        return self._webhooks.get(run_id, {}).pop(webhook_id, None) is not None

    async def enqueue(self, deliveries: Sequence[Delivery]) -> None:
        for delivery in deliveries:
            self._queue.setdefault(delivery.delivery_id, delivery)

    async def due(self, now_ms: int, limit: int, lease_ms: int) -> list[Delivery]:
        ready = sorted(
            (d for d in self._queue.values() if d.next_at_ms <= now_ms),
            key=lambda d: (d.next_at_ms, d.delivery_id),
        )[:limit]
        for delivery in ready:
            self._queue[delivery.delivery_id] = dataclasses.replace(
                delivery, next_at_ms=now_ms + lease_ms
            )
        return ready

    async def next_due(self) -> int | None:
        return min((d.next_at_ms for d in self._queue.values()), default=None)

    async def delivered(self, delivery_id: str) -> None:
        self._queue.pop(delivery_id, None)

    async def retry(self, delivery_id: str, attempts: int, next_at_ms: int) -> None:
        delivery = self._queue.get(delivery_id)
        if delivery is not None:
            self._queue[delivery_id] = dataclasses.replace(
                delivery, attempts=attempts, next_at_ms=next_at_ms
            )
