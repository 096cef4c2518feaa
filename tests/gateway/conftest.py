"""Fixtures of the HTTP adapter tests: HTTP clients, and a scripted gRPC service.

`ScriptedService` serves any service descriptor over a real gRPC server on
loopback: it records each request and answers from a table (a reply, a list of
streamed messages, or a status). With it, transcoding is checked exactly,
whatever the real service implements today.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message

from service.gateway.server import AGENT_GATEWAY, HttpGateway
from service.testing import Harness


@dataclass
class Script:
    """What one method answers: a reply (unary) or messages (streaming), then a status.

    `headers_first` sends the initial metadata at once, and `delay_s` then waits
    before the messages (a slow or loaded service).
    """

    reply: Message | None = None
    messages: list[Message] = field(default_factory=list)
    code: grpc.StatusCode = grpc.StatusCode.OK
    details: str = ""
    trailing_metadata: tuple[tuple[str, Any], ...] = ()
    headers_first: bool = False
    delay_s: float = 0.0


class ScriptedService:
    """A gRPC server for `service` whose methods play `scripts[method name]`."""

    def __init__(self, service: ServiceDescriptor) -> None:
        self.service = service
        self.scripts: dict[str, Script] = {}
        self.requests: list[tuple[str, Message]] = []
        self.metadata: list[tuple[tuple[str, str], ...]] = []
        self.server = grpc.aio.server()
        handlers = {m.name: self._handler(m) for m in service.methods}
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service.full_name, handlers),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def last(self, method: str) -> Message:
        return [r for name, r in self.requests if name == method][-1]

    def _handler(self, method: MethodDescriptor) -> grpc.RpcMethodHandler:
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)

        async def play(request: Message, context: Any) -> Message | None:
            self.requests.append((method.name, request))
            self.metadata.append(tuple(context.invocation_metadata() or ()))
            script = self.scripts.get(method.name, Script())
            if script.headers_first:
                await context.send_initial_metadata(())
            if script.delay_s:
                await asyncio.sleep(script.delay_s)
            for message in script.messages:
                await context.write(message)
            if script.code != grpc.StatusCode.OK:
                await context.abort(
                    script.code, script.details, trailing_metadata=script.trailing_metadata
                )
            if method.server_streaming:
                return None
            return script.reply or response_class()

        options = {
            "request_deserializer": request_class.FromString,
            "response_serializer": response_class.SerializeToString,
        }
        if method.server_streaming:
            return grpc.unary_stream_rpc_method_handler(play, **options)
        return grpc.unary_unary_rpc_method_handler(play, **options)


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedService]:
    service = ScriptedService(AGENT_GATEWAY)
    await service.server.start()
    try:
        yield service
    finally:
        await service.server.stop(None)


@dataclass
class Adapter:
    """An HttpGateway in front of some gRPC target, and an HTTP client for it."""

    gateway: HttpGateway
    http: httpx.AsyncClient


@pytest.fixture
async def adapter(scripted: ScriptedService) -> AsyncIterator[Adapter]:
    """The adapter in front of the scripted service."""
    gateway = HttpGateway(scripted.target, heartbeat_s=30.0, max_body_bytes=64 * 1024)
    await gateway.start("127.0.0.1:0")
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.port}") as http:
            yield Adapter(gateway, http)
    finally:
        await gateway.stop()


@pytest.fixture
async def http(gateway: Harness) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of the whole service's adapter."""
    async with httpx.AsyncClient(base_url=gateway.http_url, timeout=10.0) as client:
        yield client
