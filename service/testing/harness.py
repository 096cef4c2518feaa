"""The service in-process, for tests (users' too): `Harness` on loopback, `InProcess` bare.

    async with LoopbackProvider() as provider, Harness.start(tmp_path, provider) as gw:
        provider.enqueue([content("Hi"), finish("stop"), DONE])
        events = await gw.query("my_agent", "Hello")

The harness runs the whole `App` (gRPC server on an ephemeral loopback port,
real HTTP client to the provider, a `LoopbackProvider` of
`service.providers.loopback`), so tests exercise the real transports.

`InProcess` runs the core alone, with no socket at all: the front door over an
agents directory, in-memory state, and a `ScriptedModel` (an in-process model,
`service.testing.scripted`) as its only provider.

    model = ScriptedModel()
    async with InProcess.start(agents_dir, model) as core:
        model.enqueue([content("Hi"), finish("stop")])
        events = await core.query("my_agent", "Hello")
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc

from service.assembly.app import App
from service.assembly.config import ProviderSettings, Settings
from service.core.agents.registry import AgentRegistry
from service.core.agents.skills import SkillRegistry
from service.core.chats.uploads import Uploads
from service.core.commands import QueryCommand
from service.core.frontdoor import FrontDoor
from service.core.lifecycle import RunOptions
from service.core.model import ModelClient
from service.core.tools.registry import BackendTool, ToolRegistry
from service.core.tools.skill_tool import SkillTools
from service.providers.loopback import LoopbackProvider
from service.providers.registry import ProviderRegistry
from service.state.files.uploads import FileUploadStore
from service.state.local.bus import LocalRunBus
from service.state.local.stores import LocalChatStore, LocalRunLog

FAKE_PROVIDER = "fake"
FAKE_MODEL = "fake-model"


def write_agent(directory: Path, key: str, definition: dict[str, Any]) -> Path:
    """Write `definition` as the agent file `directory/key.json`."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{key}.json"
    path.write_text(json.dumps(definition, ensure_ascii=False, indent=2))
    return path


def oneshot_agent(system_prompt: str = "You are helpful.", **extra: Any) -> dict[str, Any]:
    return {"mode": "ONESHOT", "plain": {"systemPrompt": system_prompt}, **extra}


@asynccontextmanager
async def serve_gateway(servicer: gateway_pb2_grpc.AgentGatewayServicer) -> AsyncIterator[str]:
    """`servicer` — a scripted AgentGateway, standing in for the whole service in a client's
    tests — on a real gRPC server on loopback while the block runs: its target."""
    server = grpc.aio.server()
    gateway_pb2_grpc.add_AgentGatewayServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


@dataclass
class Harness:
    """A running service and a client stub connected to it."""

    app: App
    channel: grpc.aio.Channel
    stub: gateway_pb2_grpc.AgentGatewayAsyncStub

    @staticmethod
    @asynccontextmanager
    async def start(
        agents_dir: Path, provider: LoopbackProvider | None = None, **overrides: Any
    ) -> AsyncIterator[Harness]:
        """Start the service on loopback with `provider` as its only (default) provider.

        Chats, run logs and uploads go to `data/` beside `agents_dir` unless overridden.
        """
        providers = {}
        if provider is not None:
            providers[FAKE_PROVIDER] = ProviderSettings(
                base_url=provider.url,
                default_model=FAKE_MODEL,
                max_retries=0,
                read_timeout_s=10,
            )
        defaults: dict[str, Any] = {
            "grpc_address": "127.0.0.1:0",
            "http_address": "127.0.0.1:0",
            "agents_dir": agents_dir,
            "agents_watch": False,
            "data_dir": agents_dir.parent / "data",
            "providers": providers,
            "default_provider": FAKE_PROVIDER if provider else "",
            "mcp_servers": [],  # not the example server `make run` starts
        }
        settings = Settings(**{**defaults, **overrides})
        app = App(settings)
        await app.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc.port}")
        try:
            yield Harness(app, channel, gateway_pb2_grpc.AgentGatewayStub(channel))
        finally:
            await channel.close()
            await app.stop()

    @property
    def http_url(self) -> str:
        """Base URL of the HTTP/SSE adapter and web page, e.g. "http://127.0.0.1:41234"."""
        if self.app.http is None:
            raise RuntimeError("the HTTP adapter is off (http_enabled=False)")
        return f"http://127.0.0.1:{self.app.http.port}"

    async def query(self, agent_key: str, message: str, **fields: Any) -> list[pb.Event]:
        """Run a query to its end and return every event."""
        request = gw.QueryRequest(agent_key=agent_key, message=message, **fields)
        return [event async for event in self.stub.Query(request)]


@dataclass
class InProcess:
    """The core without transports: the front door, its agents and tools, one in-process model.

    State is in memory (chats, run logs, live runs); uploads go to a directory.
    """

    frontdoor: FrontDoor
    tools: ToolRegistry

    @staticmethod
    @asynccontextmanager
    async def start(
        agents_dir: Path,
        model: ModelClient,
        *,
        default_model: str = FAKE_MODEL,
        tools_dir: Path | None = None,
        builtin: Iterable[BackendTool] = (),
        data_dir: Path | None = None,
        skills_dir: Path | None = None,
    ) -> AsyncIterator[InProcess]:
        """The front door over the agents of `agents_dir`, with `model` as its only provider.

        Uploads go to `data/` beside `agents_dir` unless overridden. With `skills_dir`,
        its skills are offered (and the `skill` tool is there).
        """
        data = data_dir or agents_dir.parent / "data"
        agents = AgentRegistry(agents_dir)
        agents.load_all()
        skills = SkillRegistry(skills_dir) if skills_dir is not None else None
        sources = [SkillTools(skills, agents)] if skills is not None else []
        if skills is not None:
            skills.load_all()
        tools = ToolRegistry(tools_dir, builtin=builtin, sources=sources)
        tools.load_all()
        providers = ProviderRegistry()
        providers.register(model.key, model, default_model=default_model)
        frontdoor = FrontDoor(
            agents,
            providers,
            chats=LocalChatStore(),
            run_log=LocalRunLog(),
            bus=LocalRunBus(),
            uploads=Uploads(FileUploadStore(data / "uploads"), 16 * 1024 * 1024),
            tools=tools,
            skills=skills,
            options=RunOptions(),
        )
        await frontdoor.open()
        try:
            yield InProcess(frontdoor, tools)
        finally:
            await frontdoor.drain(0)
            await frontdoor.close()
            await providers.aclose()

    async def query(
        self,
        agent_key: str,
        message: str,
        *,
        cancel_when: Callable[[pb.Event], bool] | None = None,
        **fields: Any,
    ) -> list[pb.Event]:
        """Run a query to its end and return every event.

        `cancel_when`: cancel the run after the first event it is true of.
        """
        run = await self.frontdoor.query(QueryCommand(agent_key, message, **fields))
        events = []
        async for event in run.follow(0):
            events.append(event)
            if cancel_when is not None and cancel_when(event):
                cancel_when = None
                await self.frontdoor.cancel(run.run_id)
        return events
