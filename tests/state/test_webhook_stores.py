"""Every `WebhookStore` behaves the same: webhooks by run, notifications queued once each,
taken by lease, retried, forgotten when delivered; the durable ones across a reopening."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from service.core.ids import Principal
from service.core.webhooks import Delivery, Notice, Webhook, WebhookStore
from service.state import WEBHOOK_STORES, StateOptions
from tests.state.test_ports import options


def notice(run_id: str, seq: int, at_ms: int, state: str = "completed") -> Notice:
    return Notice(run_id, "c1", "agent", seq, state, b"\x08\x01", at_ms)  # type: ignore[arg-type]


def webhook(run_id: str, webhook_id: str, url: str = "http://127.0.0.1/h") -> Webhook:
    return Webhook(
        url,
        "a2a",
        "secret",
        "tok",
        "Bearer x",
        webhook_id,
        run_id,
        Principal("t", "alice"),
        1700000000000,
    )


@pytest.fixture(params=sorted(WEBHOOK_STORES))
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[WebhookStore]:
    opened = WEBHOOK_STORES[request.param](options(request, tmp_path))
    await opened.open()
    yield opened
    await opened.close()


async def test_a_runs_webhooks_are_kept_replaced_and_removed(store: WebhookStore) -> None:
    await store.add(webhook("r1", "a"))
    await store.add(webhook("r1", "b"))
    await store.add(webhook("r2", "a"))
    await store.add(webhook("r1", "a", "http://127.0.0.1/replaced"))
    assert [(w.webhook_id, w.url) for w in await store.of_run("r1")] == [
        ("a", "http://127.0.0.1/replaced"),
        ("b", "http://127.0.0.1/h"),
    ]
    assert await store.of_run("r2") == [webhook("r2", "a")]  # every field kept
    assert await store.remove("r1", "a") and not await store.remove("r1", "a")
    assert [w.webhook_id for w in await store.of_run("r1")] == ["b"]
    assert await store.of_run("nope") == []


async def test_notifications_are_queued_once_taken_by_lease_retried_and_delivered(
    store: WebhookStore,
) -> None:
    first = Delivery.of(webhook("r1", "a"), notice("r1", 3, 1000, "working"))
    second = Delivery.of(webhook("r1", "a"), notice("r1", 9, 2000))
    assert first.delivery_id != second.delivery_id
    await store.enqueue([second, first])
    await store.enqueue([first])  # queued again (a resumed run): still one
    assert await store.next_due() == 1000
    assert await store.due(500, 10, 100) == []
    taken = await store.due(5000, 10, 100)
    assert [d.delivery_id for d in taken] == [first.delivery_id, second.delivery_id]
    assert taken[0].webhook == first.webhook and taken[0].notice == first.notice
    assert await store.due(5050, 10, 100) == []  # leased
    await store.retry(first.delivery_id, 1, 6000)
    await store.delivered(second.delivery_id)
    [again] = await store.due(7000, 10, 100)
    assert (again.delivery_id, again.attempts) == (first.delivery_id, 1)
    await store.delivered(first.delivery_id)
    assert await store.due(10**12, 10, 100) == [] and await store.next_due() is None


@pytest.mark.parametrize("name", ["files", "postgres"])
async def test_the_durable_stores_keep_everything_across_a_reopening(
    request: pytest.FixtureRequest, tmp_path: Path, name: str
) -> None:
    dsn = request.getfixturevalue("postgres_dsn") if name == "postgres" else ""
    made = StateOptions(chats_dir=tmp_path / "chats", runs_dir=tmp_path / "runs", postgres_dsn=dsn)
    store = WEBHOOK_STORES[name](made)
    await store.open()
    await store.add(webhook("r1", "a"))
    queued = Delivery.of(webhook("r1", "a"), notice("r1", 3, 1000))
    await store.enqueue([queued])
    await store.close()
    again = WEBHOOK_STORES[name](made)
    await again.open()
    try:
        assert await again.of_run("r1") == [webhook("r1", "a")]
        [kept] = await again.due(5000, 10, 100)
        assert kept == Delivery(queued.delivery_id, queued.webhook, queued.notice, 0, 1000)
    finally:
        await again.close()
