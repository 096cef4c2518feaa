"""Sends the queued notifications (service/core/webhooks.py) to their webhooks.

The sender takes the notifications due from the `WebhookStore` (each taken for a lease,
so that a sender elsewhere does not take it at the same time), POSTs each at most
`concurrency` at once, and then forgets it (a 2xx answer), or notes the failed attempt
and makes it due again after a back-off that doubles from `retry_s` up to `retry_max_s`:
an answer that is not 2xx, a connection that fails, no answer in `timeout_s`. After
`max_attempts` attempts it gives up (logged). Redirects are not followed: a webhook's
URL is the one it gave. It wakes when a notification is queued (`wake`), when the next
one is due, and at least every `poll_s` (the queue may be shared with other replicas,
or taken by a sender that died: its lease runs out).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import httpx

from service.core.webhooks import Delivery, WebhookStore
from service.notify.bodies import body_of, headers_of

log = logging.getLogger("agw.webhooks")


class WebhookSender:
    """Delivers the notifications of a `WebhookStore`, at least once each."""

    def __init__(
        self,
        store: WebhookStore,
        *,
        secret: str = "",
        max_attempts: int = 10,
        retry_s: float = 1.0,
        retry_max_s: float = 600.0,
        timeout_s: float = 10.0,
        concurrency: int = 8,
        poll_s: float = 5.0,
    ) -> None:
        self.store = store
        self.secret = secret
        self.max_attempts = max_attempts
        self.retry_s = retry_s
        self.retry_max_s = retry_max_s
        self.timeout_s = timeout_s
        self.concurrency = concurrency
        self.poll_s = poll_s
        self._wake = asyncio.Event()
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """Look at the queue now: a notification was queued."""
        self._wake.set()

    async def start(self) -> None:
        self._client = httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=False)
        self._task = asyncio.create_task(self._loop(), name="webhook-sender")

    async def stop(self) -> None:
        """Stop sending (what is not sent stays queued for the next start)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _loop(self) -> None:
        lease_ms = int((self.timeout_s + 10) * 1000)
        while True:
            self._wake.clear()
            try:
                due = await self.store.due(_now_ms(), self.concurrency, lease_ms)
            except Exception:
                log.exception("could not read the notification queue")
                due = []
            if due:
                await asyncio.gather(*(self._send(d) for d in due))
                continue
            await self._sleep()

    async def _sleep(self) -> None:
        """Until woken, the next notification is due, or `poll_s` has passed."""
        wait_s = self.poll_s
        with contextlib.suppress(Exception):
            next_due = await self.store.next_due()
            if next_due is not None:
                wait_s = min(wait_s, max(0.0, (next_due - _now_ms()) / 1000))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                await self._wake.wait()

    async def _send(self, delivery: Delivery) -> None:
        assert self._client is not None
        webhook = delivery.webhook
        try:
            body = body_of(delivery)
            headers = headers_of(delivery, body, self.secret, int(time.time()))
        except Exception:  # a notification that cannot be written will never be: drop it
            log.exception("notification %s cannot be written; dropped", delivery.delivery_id)
            with contextlib.suppress(Exception):
                await self.store.delivered(delivery.delivery_id)
            return
        try:
            response = await self._client.post(webhook.url, content=body, headers=headers)
            failure = "" if response.is_success else f"HTTP {response.status_code}"
        except (httpx.HTTPError, httpx.InvalidURL, ValueError) as error:
            failure = f"{type(error).__name__}: {error}"[:200]
        try:
            if not failure:
                await self.store.delivered(delivery.delivery_id)
                return
            attempts = delivery.attempts + 1
            if attempts >= self.max_attempts:
                log.warning(
                    "gave up notifying %s of run %s after %d attempts (%s)",
                    _shown(webhook.url),
                    delivery.notice.run_id,
                    attempts,
                    failure,
                )
                await self.store.delivered(delivery.delivery_id)
                return
            delay_s = min(self.retry_s * 2 ** (attempts - 1), self.retry_max_s)
            log.info(
                "notifying %s of run %s failed (%s); attempt %d in %.1fs",
                _shown(webhook.url),
                delivery.notice.run_id,
                failure,
                attempts + 1,
                delay_s,
            )
            await self.store.retry(delivery.delivery_id, attempts, _now_ms() + int(delay_s * 1000))
        except Exception:
            log.exception("could not note the outcome of notification %s", delivery.delivery_id)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _shown(url: str) -> str:
    """A URL for a log line: without its query (which may hold a token)."""
    return url.split("?", 1)[0][:200]
