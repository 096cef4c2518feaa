"""A throwaway redis-server, and replicas of the service sharing it.

The server is real (`redis-server` from Debian, installed by `make install`):
one per test session, on a free loopback port, persisting nothing, in a
temporary directory, stopped at the end; every test starts on an empty
database. A replica is what a process of the service is, minus the settings:
its own front door, its own `RedisRunBus` (its own replica id) and its own
gRPC server. Replicas of one test share one chat store and one run log object,
as they would share a database.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc

from service.core.agents.registry import AgentRegistry
from service.core.chats.uploads import Uploads
from service.core.frontdoor import FrontDoor
from service.core.lifecycle import RunOptions
from service.core.tools.registry import ToolRegistry
from service.providers.loopback import LoopbackProvider
from service.providers.openai import ProviderOptions
from service.providers.registry import ProviderRegistry
from service.state.files.uploads import FileUploadStore
from service.state.local.stores import LocalChatStore, LocalRunJournal, LocalRunLog
from service.state.postgres.journal import PostgresRunJournal
from service.state.redis.bus import RedisRunBus
from service.testing import FAKE_MODEL, FAKE_PROVIDER, oneshot_agent, write_agent
from service.transport.server import GrpcServer
from tests.core.tools.kit import Probe, agent, tools, write_ui_tools


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_redis(binary: str, directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server on a free loopback port, answering PING; retried if the port was taken."""
    for _ in range(5):
        port = free_port()
        process = subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + 10
        while process.poll() is None and time.monotonic() < deadline:
            try:
                with redis.Redis.from_url(url) as client:
                    client.ping()
                return process, url
            except redis.ConnectionError:
                time.sleep(0.02)
        process.kill()
        process.wait()
    raise RuntimeError(f"redis-server did not start in {directory}")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a throwaway redis-server, for the whole session."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed: run `make install` (Debian: redis-server)")
    process, url = _start_redis(binary, tmp_path_factory.mktemp("redis"))
    try:
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def redis_url(redis_server: str) -> str:
    """The throwaway server, emptied for this test."""
    with redis.Redis.from_url(redis_server) as client:
        client.flushall()
    return redis_server


AGENTS = {
    "plain": oneshot_agent("You are terse."),
    "ui": agent(toolConfig=tools(frontends=("pick",))),
}


@dataclass
class Replica:
    """One replica of the service: its front door, its bus, its gRPC server and a client."""

    name: str
    front: FrontDoor
    bus: RedisRunBus
    port: int
    channel: grpc.aio.Channel
    stub: gateway_pb2_grpc.AgentGatewayAsyncStub
    server: GrpcServer

    def query(self, agent_key: str, message: str, **fields: Any) -> Any:
        """The Query call (a stream of events)."""
        return self.stub.Query(gw.QueryRequest(agent_key=agent_key, message=message, **fields))

    async def ask(self, agent_key: str, message: str, **fields: Any) -> list[pb.Event]:
        """Every event of a query run to its end."""
        return await rest(self.query(agent_key, message, **fields))

    async def attach(self, run_id: str, after_seq: int = 0) -> list[pb.Event]:
        return await rest(self.stub.Attach(gw.AttachRequest(run_id=run_id, after_seq=after_seq)))


@dataclass
class Replicas:
    """Replicas sharing one Redis, one chat store and one run log."""

    members: dict[str, Replica]
    chats: LocalChatStore
    run_log: LocalRunLog

    def __getitem__(self, name: str) -> Replica:
        return self.members[name]


@asynccontextmanager
async def started(
    tmp_path: Path,
    provider: LoopbackProvider,
    redis_url: str,
    names: tuple[str, ...] = ("A", "B", "C"),
    *,
    lease_ttl_s: float | dict[str, float] = 2.0,
    reply_timeout_s: float = 2.0,
    retention_s: float = 60.0,
    agents: dict[str, dict[str, Any]] | None = None,
    journal: bool | str = False,
    park_after_s: float = 30.0,
) -> AsyncIterator[Replicas]:
    """Replicas `names` of the service on `provider`, with the test agents (and `agents`)
    and UI tools.

    `lease_ttl_s`: every replica's, or each one's by name. `journal`: the replicas journal
    their runs in one journal they share (as they would in PostgreSQL; a DSN: in that
    PostgreSQL database), so that a run whose owner is lost resumes on another.
    """
    agents_dir = tmp_path / "agents"
    for key, definition in {**AGENTS, **(agents or {})}.items():
        write_agent(agents_dir, key, definition)
    tools_dir = write_ui_tools(tmp_path / "tools")
    chats, run_log = LocalChatStore(), LocalRunLog()
    shared_journal = LocalRunJournal() if journal is True else None
    members: dict[str, Replica] = {}
    stops: list[Any] = []
    try:
        for name in names:
            agents = AgentRegistry(agents_dir)
            agents.load_all()
            tool_registry = ToolRegistry(tools_dir, builtin=Probe().tools())
            tool_registry.load_all()
            options = ProviderOptions(
                base_url=provider.url,
                default_model=FAKE_MODEL,
                max_retries=0,
                read_timeout_s=10,
                headers={"x-replica": name},  # which replica asked (provider.request_headers)
            )
            providers = ProviderRegistry({FAKE_PROVIDER: options})
            bus = RedisRunBus(
                redis_url,
                replica_id=name,
                lease_ttl_s=lease_ttl_s[name] if isinstance(lease_ttl_s, dict) else lease_ttl_s,
                reply_timeout_s=reply_timeout_s,
            )
            front = FrontDoor(
                agents,
                providers,
                chats=chats,
                run_log=run_log,
                bus=bus,
                uploads=Uploads(FileUploadStore(tmp_path / name / "uploads"), 1 << 20),
                tools=tool_registry,
                options=RunOptions(
                    retention_s=retention_s, replica=name, park_after_s=park_after_s
                ),
                journal=PostgresRunJournal(journal) if isinstance(journal, str) else shared_journal,
            )
            await front.open()
            server = GrpcServer(front, "127.0.0.1:0")
            await server.start()
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
            stub = gateway_pb2_grpc.AgentGatewayStub(channel)
            members[name] = Replica(name, front, bus, server.port, channel, stub, server)
            stops.append((channel, server, front, providers))
        yield Replicas(members, chats, run_log)
    finally:
        for channel, server, front, providers in reversed(stops):
            await channel.close()
            await server.stop(1.0)
            await front.close()
            await providers.aclose()


async def until(call: Any, kind: str, seen: list[pb.Event]) -> pb.Event:
    """Read `call` into `seen` up to the first event of type `kind`."""
    async for event in call:
        seen.append(event)
        if event.type == kind:
            return event
    raise AssertionError(f"no {kind} in {[e.type for e in seen]}")


async def rest(call: Any, timeout_s: float = 15.0) -> list[pb.Event]:
    """The remaining events of `call`, which must end within `timeout_s`."""
    async with asyncio.timeout(timeout_s):
        return [event async for event in call]


async def eventually(check: Any, timeout_s: float = 10.0) -> None:
    """Wait until `check()` (a coroutine function) is true."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("the condition did not hold in time")
        await asyncio.sleep(0.01)


def parked_on(replicas: Any, *names: str) -> Any:
    """A check for `eventually`: exactly one run is parked, on one of the replicas `names`."""

    async def check() -> bool:
        return sum(replicas[name].front.lifecycle.parked_runs for name in names) == 1

    return check
