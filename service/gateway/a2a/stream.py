"""How the A2A endpoint streams: a turn's gRPC call and fold, and the SSE it writes.

`Turn` reads the service's events and folds them into A2A updates; `SseWriter`
writes each JSON-RPC response as one SSE `data:` message at once, a heartbeat
event as a comment, and gives up on a client that reads nothing for
`write_timeout_s` (`ClientGone`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import orjson
from aiohttp import web

from service.gateway.a2a.task import TaskFold
from service.gateway.sse import HEADERS, HEARTBEAT, ClientGone


class Turn:
    """A call to the service streaming a task's events, and their fold."""

    def __init__(self, call: Any, fold: TaskFold, first: list[Any]) -> None:
        self.call = call
        self.fold = fold
        self.first = first  # the updates made before the turn was handed over

    async def updates(self) -> AsyncIterator[list[Any]]:
        """The updates of each further event (empty for a heartbeat), to the run's end."""
        while True:
            event = await self.call.read()
            if event is grpc.aio.EOF:
                return
            yield self.fold.apply(event)


class SseWriter:
    """Server-Sent Events: one `data:` message per JSON-RPC response, written at once."""

    def __init__(self, request: web.Request, write_timeout_s: float) -> None:
        self.request = request
        self.write_timeout_s = write_timeout_s
        self.response = web.StreamResponse(headers=HEADERS)

    async def open(self) -> None:
        try:
            await self.response.prepare(self.request)
        except ConnectionError:
            raise ClientGone("client gone") from None

    async def send(self, message: dict[str, Any]) -> None:
        await self._write(b"data: " + orjson.dumps(message) + b"\n\n")

    async def comment(self) -> None:
        await self._write(HEARTBEAT)

    async def _write(self, data: bytes) -> None:
        try:
            async with asyncio.timeout(self.write_timeout_s):
                await self.response.write(data)
        except TimeoutError:
            raise ClientGone("write timeout") from None
        except ConnectionError:
            raise ClientGone("client gone") from None
