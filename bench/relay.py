"""The minimal relays: read the provider's SSE, send one gRPC message per delta, nothing else.

`Query` posts the query's message to the provider as a streaming chat
completion, splits the body into SSE events, takes each chunk's
`choices[0].delta.content` and writes it as a `content.delta` event (same
envelope as the gateway's). No run, no log, no start/end events, no retries.
Two HTTP clients are measured: httpx and aiohttp (what the gateway uses).

`ContractRelay` (`relay-contract`) is the aiohttp relay that also writes the
events a gateway run's stream carries by contract, each its own gRPC message
(a 1-delta run: seven): `request.query`, `chat.start`, `run.start`, then
`content.start` before the first delta, `content.end` and `run.complete` after
the body. Their payloads are empty; it is the floor the streaming contract
itself sets, with none of a run's other work.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import httpx
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw

from bench.baseline import Context, Envelope
from bench.protocol import MODEL

_HEADERS = {"Accept": "text/event-stream", "Content-Type": "application/json"}


def request_body(message: str) -> bytes:
    body = {"model": MODEL, "messages": [{"role": "user", "content": message}], "stream": True}
    return json.dumps(body, separators=(",", ":")).encode()


async def relay(
    chunks: AsyncIterator[bytes], context: Context, envelope: Envelope, *, start: bool = False
) -> int:
    """Write one `content.delta` per SSE delta read from `chunks`, to the end of the body,
    and with `start` a `content.start` before the first; the number of deltas written."""
    written = 0
    buf = b""
    async for chunk in chunks:
        buf += chunk
        if b"\n\n" not in buf:
            continue
        *events, buf = buf.split(b"\n\n")
        for event in events:
            if not event.startswith(b"data: ") or event == b"data: [DONE]":
                continue
            choices = json.loads(event[6:]).get("choices")
            text = choices[0]["delta"].get("content") if choices else None
            if text:
                if start and not written:
                    begun = pb.ContentStart(content_id=envelope.content_id)
                    await context.write(envelope.event("content.start", content_start=begun))
                written += 1
                await context.write(envelope.delta(text))
    return written


class HttpxRelay:
    """The relay on one pooled `httpx.AsyncClient`."""

    def __init__(self, provider_url: str, max_connections: int) -> None:
        self.url = provider_url.rstrip("/") + "/chat/completions"
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self.client = httpx.AsyncClient(headers=_HEADERS, timeout=60.0, limits=limits)

    async def Query(self, request: gw.QueryRequest, context: Context) -> None:
        body = request_body(request.message)
        async with self.client.stream("POST", self.url, content=body) as response:
            response.raise_for_status()
            await relay(response.aiter_bytes(), context, Envelope())

    async def aclose(self) -> None:
        await self.client.aclose()


class AiohttpRelay:
    """The relay on one pooled `aiohttp.ClientSession`."""

    def __init__(self, provider_url: str, max_connections: int) -> None:
        self.url = provider_url.rstrip("/") + "/chat/completions"
        self.max_connections = max_connections
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.max_connections)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=60.0)
        self.session = aiohttp.ClientSession(connector=connector, headers=_HEADERS, timeout=timeout)

    async def Query(self, request: gw.QueryRequest, context: Context) -> None:
        await self.stream(request, context, Envelope())

    async def stream(
        self, request: gw.QueryRequest, context: Context, envelope: Envelope, start: bool = False
    ) -> int:
        """Post the query, relay the body's deltas (see `relay`); the number written."""
        assert self.session is not None
        body = request_body(request.message)
        async with self.session.post(self.url, data=body) as response:
            response.raise_for_status()
            return await relay(_chunks(response), context, envelope, start=start)

    async def aclose(self) -> None:
        if self.session is not None:
            await self.session.close()


class ContractRelay(AiohttpRelay):
    """The aiohttp relay writing, besides the deltas, the events of a run's stream contract."""

    async def Query(self, request: gw.QueryRequest, context: Context) -> None:
        envelope = Envelope()
        await context.write(envelope.event("request.query", request_query=pb.RequestQuery()))
        await context.write(envelope.event("chat.start", chat_start=pb.ChatStart()))
        await context.write(envelope.event("run.start", run_start=pb.RunStart()))
        if await self.stream(request, context, envelope, start=True):
            end = pb.ContentEnd(content_id=envelope.content_id)
            await context.write(envelope.event("content.end", content_end=end))
        await context.write(envelope.event("run.complete", run_complete=pb.RunComplete()))


async def _chunks(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    async for chunk in response.content.iter_any():
        yield chunk
