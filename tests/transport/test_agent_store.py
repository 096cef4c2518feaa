"""Agents in the agent store: created, updated, rolled back with versions, by admins only.

Through the real service and the Python client: each write is validated like an agent
file (the same report), served at once in place of a file of the same key, and kept as a
version; a run keeps the definition it started with; two replicas on one PostgreSQL serve a
new version within a second of its write (LISTEN/NOTIFY).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from agw.v1 import gateway_pb2 as gw
from agw_client import (
    AgentNotFound,
    AsyncClient,
    Conflict,
    InvalidRequest,
    NotFound,
    PermissionDenied,
)
from google.protobuf import json_format

from service.assembly.config import ApiKeySettings
from service.core.agents.loader import AgentDefinitionError, load_agent_file
from service.core.ids import ADMIN, Principal
from service.providers.loopback import Gate, LoopbackProvider
from service.testing import Harness, oneshot_agent, write_agent
from tests.core.tools.kit import Probe, answer_turn, call_turn, tool_gateway, tools

KEYS = [
    ApiKeySettings(key="key-root-1234567890", tenant="ops", subject="root", roles=["admin"]),
    ApiKeySettings(key="key-alice-1234567890", tenant="acme", subject="alice"),
]

ADMINISTRATOR = Principal("ops", "root", roles=frozenset({ADMIN}))


def client(gateway: Harness, name: str) -> AsyncClient:
    target = f"127.0.0.1:{gateway.app.grpc.port}"
    return AsyncClient(target, token=f"key-{name}-1234567890", retries=0)


def system_prompt(request: dict[str, Any]) -> str:
    return str(request["messages"][0]["content"])


@pytest.fixture
async def gateway(tmp_path: Path, provider: LoopbackProvider) -> AsyncIterator[Harness]:
    agents = {"filed": oneshot_agent("From the file."), "helper": oneshot_agent("Help.")}
    async with tool_gateway(
        tmp_path, provider, agents, Probe(), auth_api_keys=KEYS, agent_store="memory"
    ) as harness:
        yield harness


async def test_an_agent_is_created_updated_and_rolled_back_with_its_versions(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    async with client(gateway, "root") as root, client(gateway, "alice") as alice:
        created = await root.create_agent(
            "writer", oneshot_agent("Version one."), comment="first draft"
        )
        assert (created.agent_key, created.version, created.change) == (
            "writer",
            1,
            gw.AGENT_CHANGE_CREATED,
        )
        assert (created.created_by, created.comment) == ("ops/root", "first draft")
        assert json_format.MessageToDict(created.definition) == oneshot_agent("Version one.")
        listed = {a.key: a.version for a in await alice.list_agents()}
        assert listed == {"filed": 0, "helper": 0, "writer": 1}
        provider.enqueue(answer_turn("one"))
        assert (await alice.ask("writer", "Hi")).answer == "one"
        assert system_prompt(provider.requests[-1]).startswith("Version one.")

        text = (
            '{"mode": "ONESHOT", "plain": {"systemPrompt": """\nVersion two,\non two lines.\n"""}}'
        )
        updated = await root.update_agent("writer", text, expected_version=1)
        assert (updated.version, updated.change) == (2, gw.AGENT_CHANGE_UPDATED)
        got = await alice.get_agent("writer")
        assert got.agent.version == 2
        assert got.definition["plain"]["systemPrompt"] == "Version two,\non two lines."
        provider.enqueue(answer_turn("two"))
        await alice.ask("writer", "Hi")
        assert system_prompt(provider.requests[-1]).startswith("Version two,\non two lines.")

        back = await root.rollback_agent("writer", 1, comment="two was worse")
        assert (back.version, back.change, back.source_version) == (
            3,
            gw.AGENT_CHANGE_ROLLED_BACK,
            1,
        )
        provider.enqueue(answer_turn("one again"))
        await alice.ask("writer", "Hi")
        assert system_prompt(provider.requests[-1]).startswith("Version one.")
        versions = await root.list_agent_versions("writer")
        assert [(v.version, v.change) for v in versions] == [
            (3, gw.AGENT_CHANGE_ROLLED_BACK),
            (2, gw.AGENT_CHANGE_UPDATED),
            (1, gw.AGENT_CHANGE_CREATED),
        ]
        assert versions[0].definition == versions[2].definition

        with pytest.raises(Conflict) as stale:  # version 3 is current, not 2
            await root.update_agent("writer", oneshot_agent("Late."), expected_version=2)
        assert (stale.value.reason, stale.value.metadata["version"]) == ("CONFLICT", "3")
        with pytest.raises(Conflict):
            await root.create_agent("writer", oneshot_agent("Again."))
        with pytest.raises(NotFound):
            await root.rollback_agent("writer", 9)
        with pytest.raises(AgentNotFound):
            await root.update_agent("nobody", oneshot_agent("x"))
        with pytest.raises(AgentNotFound):
            await root.list_agent_versions("filed")  # a file, not in the store


async def test_a_stored_agent_replaces_the_file_of_its_key(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    async with client(gateway, "root") as root:
        provider.enqueue(answer_turn("file"), answer_turn("store"))
        await root.ask("filed", "Hi")
        assert system_prompt(provider.requests[-1]).startswith("From the file.")
        await root.create_agent("filed", oneshot_agent("From the store."))
        await root.ask("filed", "Hi")
        assert system_prompt(provider.requests[-1]).startswith("From the store.")
        assert (await root.get_agent("filed")).agent.version == 1


async def test_a_definition_is_refused_as_its_file_would_be(
    gateway: Harness, tmp_path: Path
) -> None:
    broken = {"mode": "SOMETIMES", "plain": {"systemPrompt": "x"}, "budget": {"maxSteps": -1}}
    path = write_agent(tmp_path / "elsewhere", "broken", broken)
    with pytest.raises(AgentDefinitionError) as as_file:
        load_agent_file(path)
    async with client(gateway, "root") as root:
        with pytest.raises(InvalidRequest) as as_call:
            await root.create_agent("broken", broken)
        assert (
            as_call.value.message == f"agent 'broken': {'; '.join(map(str, as_file.value.issues))}"
        )
        with pytest.raises(InvalidRequest, match=r"definitionText: line 1, column 2"):
            await root.create_agent("broken", "{oops")
        with pytest.raises(InvalidRequest, match="key"):
            await root.create_agent("bad key!", oneshot_agent())
        with pytest.raises(InvalidRequest, match="definition"):
            await root.create_agent("nothing", {})
        assert "broken" not in {a.key for a in await root.list_agents()}


async def test_only_admins_manage_agents_and_only_with_a_store(
    gateway: Harness, tmp_path: Path, provider: LoopbackProvider
) -> None:
    async with client(gateway, "alice") as alice:
        calls = [
            alice.create_agent("mine", oneshot_agent()),
            alice.update_agent("helper", oneshot_agent()),
            alice.rollback_agent("helper", 1),
            alice.list_agent_versions("helper"),
        ]
        for call in calls:
            with pytest.raises(PermissionDenied) as denied:
                await call
            assert (denied.value.reason, denied.value.metadata) == (
                "PERMISSION_DENIED",
                {"role": "admin"},
            )
    agents = tmp_path / "plain-agents"
    write_agent(agents, "plain", oneshot_agent())
    async with (
        Harness.start(agents, provider, http_enabled=False) as files_only,
        AsyncClient(f"127.0.0.1:{files_only.app.grpc.port}", retries=0) as anyone,
    ):
        with pytest.raises(Conflict, match="AGW_AGENT_STORE"):  # anonymous: every role
            await anyone.create_agent("new", oneshot_agent())


async def test_a_run_keeps_the_version_it_started_with(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    agent = oneshot_agent("Old instructions.", toolConfig=tools("echo"))
    async with client(gateway, "root") as root:
        await root.create_agent("tooled", agent)
        provider.enqueue([Gate(gate), *call_turn(("c1", "echo", '{"x": 1}'))], answer_turn("done"))
        stream = root.query("tooled", "Go")
        async for event in stream:
            if event.type == "run.start":
                break
        new = oneshot_agent("New instructions.", toolConfig=tools("echo"))
        await root.update_agent("tooled", new)
        gate.set()
        assert (await stream.result()).outcome == "complete"
    first, second = provider.requests[-2:]
    assert system_prompt(first).startswith("Old instructions.")
    assert system_prompt(second).startswith("Old instructions.")  # its second model call


async def test_the_directory_seeds_the_store_once(
    tmp_path: Path, provider: LoopbackProvider, postgres_dsn: str
) -> None:
    agents = tmp_path / "agents"
    write_agent(agents, "plain", oneshot_agent("Seeded."))
    settings: dict[str, Any] = {
        "agent_store": "postgres",
        "agent_store_seed": True,
        "postgres_dsn": postgres_dsn,
        "http_enabled": False,
    }
    async with Harness.start(agents, provider, **settings) as first:
        versions = await first.app.frontdoor.catalog.versions(ADMINISTRATOR, "plain")
        assert [(v.version, v.change, v.created_by) for v in versions] == [(1, "seeded", "seed")]
    write_agent(agents, "plain", oneshot_agent("Edited file."))  # the store's version stays
    async with Harness.start(agents, provider, **settings) as again:
        agent = again.app.frontdoor.get_agent("plain")
        assert agent.stage("plain").system_prompt == "Seeded."
        assert again.app.agents.version_of("plain") == 1


async def test_every_replica_serves_a_new_version_within_a_second(
    tmp_path: Path, provider: LoopbackProvider, postgres_dsn: str
) -> None:
    agents = tmp_path / "agents"
    write_agent(agents, "plain", oneshot_agent())
    settings: dict[str, Any] = {
        "auth_api_keys": KEYS,
        "agent_store": "postgres",
        "agent_store_poll_s": 60.0,  # only the notifications can be that fast
        "postgres_dsn": postgres_dsn,
        "http_enabled": False,
    }
    async with (
        Harness.start(agents, provider, data_dir=tmp_path / "a", **settings) as a,
        Harness.start(agents, provider, data_dir=tmp_path / "b", **settings) as b,
        client(a, "root") as on_a,
        client(b, "alice") as on_b,
    ):
        for n in range(1, 4):
            written = (
                await on_a.create_agent("shared", oneshot_agent(f"Version {n}."))
                if n == 1
                else await on_a.update_agent("shared", oneshot_agent(f"Version {n}."))
            )
            started = time.monotonic()
            while (await on_b.list_agents()) and b.app.agents.version_of("shared") != n:
                assert time.monotonic() - started < 1.0, f"replica B still serves {n - 1}"
                await asyncio.sleep(0.01)
            assert written.version == n
            got = await on_b.get_agent("shared")
            assert got.definition["plain"]["systemPrompt"] == f"Version {n}."


async def test_a_token_holds_the_roles_its_claim_names(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = tmp_path / "agents"
    write_agent(agents, "plain", oneshot_agent())
    secret = "a-secret-of-at-least-32-bytes-for-hs256"
    settings: dict[str, Any] = {
        "auth_jwt_secret": secret,
        "auth_jwt_roles_claim": "scope",
        "agent_store": "memory",
        "http_enabled": False,
    }

    def token(**claims: Any) -> str:
        return jwt.encode({"sub": "ada", "exp": time.time() + 60, **claims}, secret)

    async with Harness.start(agents, provider, **settings) as gateway:
        target = f"127.0.0.1:{gateway.app.grpc.port}"
        for claims, allowed in (
            ({"scope": "read admin"}, True),
            ({"scope": ["admin"]}, True),
            ({"scope": "read"}, False),
            ({"roles": ["admin"]}, False),  # another claim than the one configured
            ({}, False),
        ):
            async with AsyncClient(target, token=token(**claims), retries=0) as caller:
                if allowed:
                    written = await caller.create_agent(
                        f"a{len(claims)}{time.monotonic_ns()}", oneshot_agent()
                    )
                    assert written.created_by == "default/ada"
                else:
                    with pytest.raises(PermissionDenied):
                        await caller.create_agent("denied", oneshot_agent())
