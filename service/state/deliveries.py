"""The rows of queued webhook notifications, as the SQL stores keep them (files, postgres):
(id, webhook JSON, notice JSON, attempts, next_at)."""

from __future__ import annotations

import json
from typing import Any

from service.core.webhooks import Delivery, Notice, Webhook

Row = tuple[str, str, str, int, int]


def row_of(delivery: Delivery) -> Row:
    return (
        delivery.delivery_id,
        json.dumps(delivery.webhook.to_record()),
        json.dumps(delivery.notice.to_record()),
        delivery.attempts,
        delivery.next_at_ms,
    )


def delivery_of(
    delivery_id: str, webhook: Any, notice: Any, attempts: int, next_at: int
) -> Delivery:
    """A row read back (`webhook` and `notice` as JSON text)."""
    return Delivery(
        delivery_id,
        Webhook.from_record(json.loads(webhook)),
        Notice.from_record(json.loads(notice)),
        int(attempts),
        int(next_at),
    )
