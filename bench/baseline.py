"""The bare baseline: a grpc.aio server that streams stamped deltas it makes itself.

It serves the gateway's own `Query` RPC, so the same client measures every
server, and sends real `agw.v1.Event` messages with a `content.delta` payload
and the envelope the gateway fills in (seq, type, timestamp, chat and run ids),
so the messages are the same size. No provider, no HTTP: this is the floor of
what streaming one gRPC message per delta costs in Python.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import grpc
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw

from bench.protocol import HOST, StreamSpec, schedule, stamp

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
QueryHandler: TypeAlias = Callable[[gw.QueryRequest, Context], Awaitable[None]]
SERVICE = gw.DESCRIPTOR.services_by_name["AgentGateway"].full_name

SERVER_OPTIONS = [("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", 64 * 1024 * 1024)]


class Envelope:
    """The envelope of one stream's events, as the gateway fills it."""

    __slots__ = ("chat_id", "content_id", "run_id", "seq")

    def __init__(self) -> None:
        self.run_id = secrets.token_hex(8)
        self.chat_id = str(uuid.uuid4())
        self.content_id = f"{self.run_id}_c_1"
        self.seq = 0

    def event(self, type: str, **payload: Any) -> pb.Event:
        """The stream's next event: `type`, and its payload as one keyword (`run_start=...`)."""
        self.seq += 1
        return pb.Event(
            seq=self.seq,
            type=type,
            timestamp=time.time_ns() // 1_000_000,
            chat_id=self.chat_id,
            run_id=self.run_id,
            **payload,
        )

    def delta(self, text: str) -> pb.Event:
        delta = pb.ContentDelta(content_id=self.content_id, delta=text)
        return self.event("content.delta", content_delta=delta)


async def bare_query(request: gw.QueryRequest, context: Context) -> None:
    """Play the stream the message describes; each delta is stamped as it is sent."""
    spec = StreamSpec.parse(request.message)
    envelope = Envelope()
    async for lag in schedule(spec):
        await context.write(envelope.delta(stamp(lag)))
    if spec.hold_s > 0:
        await asyncio.sleep(spec.hold_s)


async def start_grpc(query: QueryHandler) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server on an ephemeral loopback port whose `Query` is `query`.

    The handler is a coroutine writing with `context.write`, as the gateway's is.
    """
    server = grpc.aio.server(options=SERVER_OPTIONS)
    handler = grpc.unary_stream_rpc_method_handler(
        query,
        request_deserializer=gw.QueryRequest.FromString,
        response_serializer=pb.Event.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"Query": handler}),)
    )
    port = server.add_insecure_port(f"{HOST}:0")
    await server.start()
    return server, port
