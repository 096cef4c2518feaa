"""A webhook receiver for the tests: a real HTTP server on loopback that records each POST
and answers with the statuses it is told (then 200)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Received:
    """One POST the receiver got."""

    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() when it came

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    def signed_with(self, secret: bytes) -> bool:
        """Whether its Standard Webhooks signature is right for `secret`."""
        signed = f"{self.headers['Webhook-Id']}.{self.headers['Webhook-Timestamp']}.".encode()
        digest = hmac.new(secret, signed + self.body, hashlib.sha256).digest()
        return self.headers["Webhook-Signature"] == "v1," + base64.b64encode(digest).decode()


@dataclass
class Receiver:
    """The server: its URL, what it got, what it answers next."""

    url: str
    received: list[Received] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)  # answered in turn, then 200
    arrived: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def handle(self, request: web.Request) -> web.Response:
        got = Received(request.path, dict(request.headers), await request.read(), time.monotonic())
        async with self.arrived:
            self.received.append(got)
            self.arrived.notify_all()
        return web.Response(status=self.statuses.pop(0) if self.statuses else 200)

    async def wait_for(self, count: int, within_s: float = 20.0) -> list[Received]:
        """The first `count` requests, once they came."""
        async with asyncio.timeout(within_s), self.arrived:
            await self.arrived.wait_for(lambda: len(self.received) >= count)
        return self.received[:count]


@asynccontextmanager
async def receiver() -> AsyncIterator[Receiver]:
    got = Receiver("")
    app = web.Application()
    app.router.add_post("/{tail:.*}", got.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    got.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield got
    finally:
        await runner.cleanup()
