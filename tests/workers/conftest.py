"""`python -m service` with `AGW_WORKERS=2`, for real: a supervisor and two worker processes
on one gRPC port and one HTTP port, on a throwaway PostgreSQL and Redis (`tests/servers.py`).

The model is a `LoopbackProvider` in the test's process whose responder picks a script
by the user's message: "ping" is answered at once, "hold" streams one delta and then
waits for the test (`Models.release`), "choose" calls the frontend tool `pick` and, once
it has the answer, says so. Which worker served a call is read from Redis: the run's
owner replica (`agw:run:{id}:meta`), worker `i` of the supervisor being `sup-{i}`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis.asyncio as aioredis
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc

from service.providers.loopback import DONE, Gate, LoopbackProvider, content, finish
from service.testing import FAKE_MODEL, FAKE_PROVIDER, oneshot_agent, write_agent
from tests.core.tools.kit import agent, answer_turn, call_turn, tools, write_ui_tools

ROOT = Path(__file__).resolve().parents[2]
BASE = "sup"  # the supervisor's replica id; worker i is sup-i
KEYS = {"alice": "key-of-alice", "bob": "key-of-bob"}
START_TIMEOUT_S = 60.0


def auth(user: str = "alice") -> tuple[tuple[str, str]]:
    """The call metadata of `user`'s API key."""
    return (("authorization", f"Bearer {KEYS[user]}"),)


@dataclass
class Models:
    """The provider's scripts, by the user's last message; `release()` ends held streams."""

    gates: list[asyncio.Event] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def respond(self, body: dict[str, Any]) -> list[Any]:
        self.requests.append(body)
        messages = body["messages"]
        last = messages[-1]
        if last["role"] == "tool":
            return answer_turn(f"you picked {last['content']}")
        text = last["content"] if isinstance(last["content"], str) else json.dumps(last["content"])
        if text.startswith("hold"):
            gate = asyncio.Event()
            self.gates.append(gate)
            return [content("held "), Gate(gate), content("released"), finish("stop"), DONE]
        if text.startswith("choose"):
            return call_turn(("call_1", "pick", '{"options":["a","b"]}'))
        return answer_turn(f"pong: {text}")

    def release(self) -> None:
        for gate in self.gates:
            gate.set()


@dataclass
class Service:
    """The supervisor's process, its ports and log, and the shared Redis."""

    process: asyncio.subprocess.Process
    grpc_port: int
    http_port: int
    log_file: Path
    redis_url: str

    def log(self) -> str:
        return self.log_file.read_text()

    def workers(self) -> dict[int, tuple[int, str]]:
        """The latest worker started in each slot: its pid and replica id."""
        found: dict[int, tuple[int, str]] = {}
        for slot, pid, replica in re.findall(
            r"worker (\d+) started \(pid (\d+), replica (\S+)\)", self.log()
        ):
            found[int(slot)] = (int(pid), replica)
        return found

    def channel(self) -> grpc.aio.Channel:
        """A channel with a connection of its own (the kernel picks its worker)."""
        return grpc.aio.insecure_channel(
            f"127.0.0.1:{self.grpc_port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )

    async def owner(self, run_id: str) -> str:
        """The replica that executes (executed) the run."""
        async with aioredis.Redis.from_url(self.redis_url) as client:
            replica = await client.hget(f"agw:run:{run_id}:meta", "replica")
        return replica.decode() if replica else ""

    async def worker_of(self, channel: grpc.aio.Channel) -> str:
        """The replica serving `channel`'s connection: the owner of a run queried through it."""
        stub = gateway_pb2_grpc.AgentGatewayStub(channel)
        call = stub.Query(gw.QueryRequest(agent_key="plain", message="ping"), metadata=auth())
        events = await rest(call)
        return await self.owner(events[0].run_id)

    async def connection_to(self, replica: str, tries: int = 64) -> grpc.aio.Channel:
        """A channel whose connection landed on `replica` (new connections until one does)."""
        for _ in range(tries):
            channel = self.channel()
            if await self.worker_of(channel) == replica:
                return channel
            await channel.close()
        raise AssertionError(f"no connection landed on {replica} in {tries} tries")

    async def wait_log(self, pattern: str, timeout_s: float = START_TIMEOUT_S) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(pattern, self.log())
            if found:
                return found
            await asyncio.sleep(0.05)
        raise AssertionError(f"no {pattern!r} in the log:\n{self.log()}")


async def rest(call: Any, timeout_s: float = 20.0) -> list[pb.Event]:
    """The remaining events of `call`, which must end within `timeout_s`."""
    async with asyncio.timeout(timeout_s):
        return [event async for event in call]


async def until(call: Any, kind: str, seen: list[pb.Event]) -> pb.Event:
    """Read `call` into `seen` up to the first event of type `kind`."""
    async with asyncio.timeout(20):
        async for event in call:
            seen.append(event)
            if event.type == kind:
                return event
    raise AssertionError(f"no {kind} in {[e.type for e in seen]}")


def service_env(
    tmp_path: Path, provider_url: str, postgres_dsn: str, redis_url: str, **extra: str
) -> dict[str, str]:
    """The environment of `python -m service` with two workers on shared state."""
    agents = tmp_path / "agents"
    write_agent(agents, "plain", oneshot_agent("You are terse."))
    write_agent(agents, "ui", agent(toolConfig=tools(frontends=("pick",))))
    keys = [{"key": key, "subject": user} for user, key in KEYS.items()]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "gen"))),
        "AGW_WORKERS": "2",
        "AGW_REPLICA_ID": BASE,
        "AGW_GRPC_ADDRESS": "127.0.0.1:0",
        "AGW_HTTP_ADDRESS": "127.0.0.1:0",
        "AGW_AGENTS_DIR": str(agents),
        "AGW_AGENTS_WATCH": "false",
        "AGW_TOOLS_DIR": str(write_ui_tools(tmp_path / "tools")),
        "AGW_DATA_DIR": str(tmp_path / "data"),
        "AGW_CHAT_STORE": "postgres",
        "AGW_RUN_LOG": "postgres",
        "AGW_POSTGRES_DSN": postgres_dsn,
        "AGW_RUN_BUS": "redis",
        "AGW_REDIS_URL": redis_url,
        "AGW_REDIS_LEASE_TTL_S": "1",
        "AGW_AUTH_API_KEYS": json.dumps(keys),
        "AGW_SHUTDOWN_GRACE_S": "10",
        "AGW_DEFAULT_PROVIDER": FAKE_PROVIDER,
        f"AGW_PROVIDERS__{FAKE_PROVIDER.upper()}__BASE_URL": provider_url,
        f"AGW_PROVIDERS__{FAKE_PROVIDER.upper()}__DEFAULT_MODEL": FAKE_MODEL,
        f"AGW_PROVIDERS__{FAKE_PROVIDER.upper()}__MAX_RETRIES": "0",
        "AGW_LOG_LEVEL": "INFO",
        "AGW_LOG_FORMAT": "text",
    }
    env.update(extra)
    return env


async def launch(
    workdir: Path, env: dict[str, str], cwd: Path | None = None
) -> tuple[asyncio.subprocess.Process, int]:
    """`python -m service --port-file` in `cwd` (default `workdir`), its output in
    `workdir/service.log`; once it listens (the port file is written), the process and
    its gRPC port."""
    log_file = workdir / "service.log"
    port_file = workdir / "port"
    with log_file.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "service",
            "--port-file",
            str(port_file),
            cwd=cwd or workdir,
            env=env,
            stdout=log,
            stderr=log,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (port_file.exists() and port_file.read_text()):
        if process.returncode is not None or time.monotonic() > deadline:
            if process.returncode is None:
                process.kill()
            await process.wait()
            raise AssertionError("the service did not start:\n" + log_file.read_text())
        await asyncio.sleep(0.05)
    return process, int(port_file.read_text())


async def start_service(tmp_path: Path, env: dict[str, str]) -> Service:
    """Start the supervisor; return once every worker listens (its port file is written)."""
    process, grpc_port = await launch(tmp_path, env)
    log_file = tmp_path / "service.log"
    http = re.search(r"supervising 2 workers: gRPC on \S+, HTTP on \S+:(\d+)", log_file.read_text())
    assert http is not None, log_file.read_text()
    return Service(process, grpc_port, int(http.group(1)), log_file, env["AGW_REDIS_URL"])


@pytest.fixture
def models() -> Models:
    return Models()


@pytest.fixture
async def model_server(models: Models) -> AsyncIterator[LoopbackProvider]:
    async with LoopbackProvider(models.respond) as server:
        yield server


@pytest.fixture
async def service(
    tmp_path: Path, model_server: LoopbackProvider, postgres_dsn: str, redis_url: str
) -> AsyncIterator[Service]:
    """The service as two workers; stopped (SIGTERM, then SIGKILL) after the test."""
    env = service_env(tmp_path, model_server.url, postgres_dsn, redis_url)
    started = await start_service(tmp_path, env)
    try:
        yield started
    finally:
        if started.process.returncode is None:
            started.process.terminate()
            try:
                await asyncio.wait_for(started.process.wait(), 30)
            except TimeoutError:
                started.process.kill()
                await started.process.wait()
