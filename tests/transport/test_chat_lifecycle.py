"""A chat renamed, searched, deleted and expired, through the real service and its clients.

On every backend (files, memory, PostgreSQL, PostgreSQL with the Redis run bus): a deleted
chat leaves nothing behind — records, run logs, uploads, workspace, run-bus keys — and only
its owner may rename or delete it; a chat with a run in progress is refused unless the run
is cancelled first; chats unchanged past their time-to-live are swept away.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from agw.v1 import gateway_pb2 as gw
from agw_client import AsyncClient, ChatBusy, ChatNotFound, InvalidRequest, NotFound, RunNotFound

from service.assembly.config import ApiKeySettings
from service.providers.loopback import DONE, Gate, LoopbackProvider, content, finish, usage
from service.testing import Harness, oneshot_agent, write_agent

ALICE, BOB = "key-alice-1234567890", "key-bob-1234567890"
KEYS = [
    ApiKeySettings(key=ALICE, tenant="acme", subject="alice"),
    ApiKeySettings(key=BOB, tenant="acme", subject="bob"),
]
RUN = [
    "request.query",
    "chat.start",
    "run.start",
    "content.start",
    "content.delta",
    "content.end",
    "run.complete",
]
BACKENDS = ["files", "memory", "postgres", "postgres+redis"]


def answer(text: str) -> list[Any]:
    return [content(text), finish("stop"), usage(10, 5), DONE]


def held(gate: asyncio.Event) -> list[Any]:
    """An answer that stops after its first delta until `gate` is set."""
    return [content("so far"), Gate(gate), finish("stop"), DONE]


def plain_agents(tmp_path: Path) -> Path:
    agents = tmp_path / "agents"
    write_agent(agents, "plain", oneshot_agent())
    return agents


def backend_settings(request: pytest.FixtureRequest, name: str) -> dict[str, Any]:
    if name == "files":
        return {"chat_store": "jsonl", "run_log": "files", "upload_store": "files"}
    if name == "memory":
        return {"chat_store": "memory", "run_log": "memory", "upload_store": "memory"}
    settings: dict[str, Any] = {
        "chat_store": "postgres",
        "run_log": "postgres",
        "postgres_dsn": request.getfixturevalue("postgres_dsn"),
    }
    if name == "postgres+redis":
        settings |= {"run_bus": "redis", "redis_url": request.getfixturevalue("redis_url")}
    return settings


@pytest.fixture(params=BACKENDS)
async def gateway(
    request: pytest.FixtureRequest, tmp_path: Path, provider: LoopbackProvider
) -> AsyncIterator[Harness]:
    agents = plain_agents(tmp_path)
    settings = backend_settings(request, request.param)
    async with Harness.start(
        agents,
        provider,
        auth_api_keys=KEYS,
        bash_working_dir=tmp_path / "workspace",
        **settings,
    ) as harness:
        yield harness


def client(gateway: Harness, key: str) -> AsyncClient:
    return AsyncClient(f"127.0.0.1:{gateway.app.grpc.port}", token=key, retries=0)


def types(events: list[Any]) -> list[str]:
    return [e.type for e in events]


async def test_a_deleted_chat_leaves_nothing_behind(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    chat_id = "chat-to-delete"
    workspace = gateway.app.settings.bash_working_dir / "chats" / chat_id
    async with client(gateway, ALICE) as alice, client(gateway, BOB) as bob:
        upload = await alice.upload("notes.txt", b"remember this", chat_id=chat_id)
        provider.enqueue(answer("first"), answer("second"))
        first = [
            e
            async for e in alice.query(
                "plain", "Hi", chat_id=chat_id, references=[upload.reference]
            )
        ]
        second = [e async for e in alice.query("plain", "Again", chat_id=chat_id)]
        assert types(first) == RUN
        assert types(second) == [t for t in RUN if t != "chat.start"]
        workspace.mkdir(parents=True)  # what _bash_ leaves in the chat's workspace
        (workspace / "out.txt").write_text("data")
        await gateway.app.frontdoor.flush()
        runs = [first[0].run_id, second[0].run_id]
        if gateway.app.settings.run_bus == "redis":
            redis = aioredis.Redis.from_url(gateway.app.settings.redis_url.get_secret_value())
            assert await redis.exists(*(f"agw:run:{r}:events" for r in runs)) == 2

        for refused in (bob.delete_chat(chat_id), bob.rename_chat(chat_id, "mine now")):
            with pytest.raises(ChatNotFound):  # another principal's chat does not exist
                await refused
        deleted = await alice.delete_chat(chat_id)
        assert (deleted.chat_id, deleted.runs_deleted, deleted.uploads_deleted) == (chat_id, 2, 1)
        assert deleted.cancelled_run_id == ""

        with pytest.raises(ChatNotFound):
            await alice.get_chat(chat_id)
        with pytest.raises(ChatNotFound):
            await alice.delete_chat(chat_id)
        for run_id in runs:  # neither in memory (retention), nor the run log, nor Redis
            with pytest.raises(RunNotFound):
                await alice.attach(run_id).result()
        assert list((await alice.list_chats()).chats) == []
        assert not workspace.exists()
        if gateway.app.settings.run_bus == "redis":
            assert await redis.exists(*(f"agw:run:{r}:events" for r in runs)) == 0
            await redis.aclose()
        with pytest.raises(NotFound):  # the upload went with the chat
            await alice.ask("plain", "Again", references=[upload.reference])
        provider.enqueue(answer("fresh"))
        anew = [e async for e in alice.query("plain", "Hello", chat_id=chat_id)]
        assert types(anew) == RUN  # the id starts a new chat: chat.start again
        await gateway.app.frontdoor.flush()
        chat = await alice.get_chat(chat_id)
        assert [e.run_id for e in chat.events if e.type == "run.complete"] == [anew[0].run_id]


async def test_a_chat_with_a_run_in_progress_is_deleted_only_with_its_run_cancelled(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue(held(gate))
    async with client(gateway, ALICE) as alice:
        stream = alice.query("plain", "Take your time")
        seen = []
        async for event in stream:
            seen.append(event)
            if event.type == "content.delta":
                break
        with pytest.raises(ChatBusy) as busy:
            await alice.delete_chat(stream.chat_id)
        assert busy.value.metadata == {"chat_id": stream.chat_id, "run_id": stream.run_id}
        assert "cancelActiveRun" in busy.value.message
        deleted = await alice.delete_chat(stream.chat_id, cancel_active_run=True)
        assert (deleted.cancelled_run_id, deleted.runs_deleted) == (stream.run_id, 1)
        seen += [event async for event in stream]
        gate.set()
        with pytest.raises(ChatNotFound):
            await alice.get_chat(stream.chat_id)
    assert types(seen) == [
        "request.query",
        "chat.start",
        "run.start",
        "content.start",
        "content.delta",
        "content.end",
        "run.cancel",
    ]
    assert seen[-1].run_cancel.reason == "chat_deleted"


async def test_a_renamed_chat_is_shown_and_searched_by_its_new_name(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(answer("one"), answer("two"))
    async with client(gateway, ALICE) as alice, client(gateway, BOB) as bob:
        first = [e async for e in alice.query("plain", "Weather in Paris")]
        chat_id = first[0].chat_id
        other = await alice.ask("plain", "Trip to Rome")
        await gateway.app.frontdoor.flush()  # both chats recorded
        renamed = await alice.rename_chat(chat_id, "  Holidays:\n Paris  and Rome ")
        event = renamed.event
        assert (event.type, event.seq, event.chat_id, event.run_id) == (
            "chat.update",
            1,
            chat_id,
            "",
        )
        assert (event.chat_update.chat_name, event.chat_update.previous_chat_name) == (
            "Holidays: Paris and Rome",
            "Weather in Paris",
        )
        assert event.chat_update.request_id
        assert (renamed.chat.chat_id, renamed.chat.chat_name) == (
            chat_id,
            event.chat_update.chat_name,
        )
        chat = await alice.get_chat(chat_id)
        assert chat.chat_name == "Holidays: Paris and Rome"
        assert types(chat.events) == [
            "request.query",
            "chat.start",
            "run.start",
            "content.snapshot",
            "run.complete",
            "chat.update",
        ]
        replayed = chat.events[-1]
        assert (replayed.chat_update, replayed.timestamp) == (event.chat_update, event.timestamp)
        listed = await alice.list_chats(name_contains="ROME")
        assert [(c.chat_id, c.chat_name) for c in listed.chats] == [
            (chat_id, "Holidays: Paris and Rome"),
            (other.chat_id, "Trip to Rome"),
        ]
        assert [c.chat_id for c in (await alice.list_chats(name_contains="paris")).chats] == [
            chat_id
        ]
        assert list((await bob.list_chats(name_contains="rome")).chats) == []
        for name in ("", " \n ", "x" * 201):
            with pytest.raises(InvalidRequest):
                await alice.rename_chat(chat_id, name)
        with pytest.raises(InvalidRequest):
            await alice.list_chats(name_contains="x" * 201)
        with pytest.raises(ChatNotFound):
            await alice.rename_chat("no-such-chat", "name")


async def test_a_rename_during_a_run_is_replayed_after_that_run(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue(answer("first"), held(gate))
    async with client(gateway, ALICE) as alice:
        chat_id = (await alice.ask("plain", "Hi")).chat_id
        stream = alice.query("plain", "Go on", chat_id=chat_id)
        async for event in stream:
            if event.type == "content.delta":
                break
        await alice.rename_chat(chat_id, "Renamed mid-run")
        gate.set()
        await stream.result()
        await gateway.app.frontdoor.flush()
        chat = await alice.get_chat(chat_id)
    assert types(chat.events) == [
        *[t for t in RUN if t not in ("content.start", "content.delta", "content.end")][:3],
        "content.snapshot",
        "run.complete",
        "request.query",
        "run.start",
        "content.snapshot",
        "run.complete",
        "chat.update",
    ]
    assert chat.chat_name == "Renamed mid-run"


async def test_chats_are_renamed_and_deleted_over_http(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = plain_agents(tmp_path)
    gate = asyncio.Event()
    provider.enqueue(answer("one"), held(gate))
    async with (
        Harness.start(agents, provider) as gateway,
        httpx.AsyncClient(base_url=gateway.http_url, timeout=30) as http,
    ):
        chat_id = (await gateway.query("plain", "Hello"))[0].chat_id
        renamed = await http.patch(f"/api/chats/{chat_id}", json={"chatName": "Greetings"})
        assert renamed.status_code == 200, renamed.text
        data = renamed.json()["data"]
        assert (data["chat"]["chatName"], data["event"]["type"]) == ("Greetings", "chat.update")
        assert data["event"]["chatName"] == "Greetings"
        listed = await http.get("/api/chats", params={"nameContains": "greet"})
        assert [c["chatId"] for c in listed.json()["data"]["chats"]] == [chat_id]

        busy_chat = ""
        request = gw.QueryRequest(agent_key="plain", message="Busy", chat_id="busy-chat")
        stream = gateway.stub.Query(request)
        async for event in stream:
            busy_chat = event.chat_id
            if event.type == "content.delta":
                break
        refused = await http.delete(f"/api/chats/{busy_chat}")
        assert refused.status_code == 400
        assert (refused.json()["status"], refused.json()["reason"]) == (
            "FAILED_PRECONDITION",
            "CHAT_BUSY",
        )
        deleted = await http.delete(f"/api/chats/{busy_chat}", params={"cancelActiveRun": "true"})
        assert deleted.status_code == 200, deleted.text
        assert deleted.json()["data"]["cancelledRunId"]
        assert [e.type async for e in stream][-1] == "run.cancel"
        gate.set()

        gone = await http.delete(f"/api/chats/{chat_id}")
        assert gone.status_code == 200 and gone.json()["data"]["runsDeleted"] == 1
        again = await http.delete(f"/api/chats/{chat_id}")
        assert again.status_code == 404 and again.json()["reason"] == "CHAT_NOT_FOUND"
        bad = await http.delete("/api/chats/..%2Fetc")
        assert bad.status_code in (400, 404)


async def test_chats_unchanged_past_their_ttl_are_swept_away_but_not_a_running_one(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = plain_agents(tmp_path)
    gate = asyncio.Event()
    provider.enqueue(answer("old news"), held(gate))
    async with (
        Harness.start(
            agents, provider, chat_ttl_s=0.5, chat_sweep_interval_s=0.1, http_enabled=False
        ) as gateway,
        AsyncClient(f"127.0.0.1:{gateway.app.grpc.port}", retries=0) as agw,
    ):
        old = await agw.ask("plain", "Old")
        stream = agw.query("plain", "Slow")
        async for event in stream:
            if event.type == "content.delta":
                break
        deadline = time.monotonic() + 10
        while any(c.chat_id == old.chat_id for c in (await agw.list_chats()).chats):
            assert time.monotonic() < deadline, "the expired chat was not swept"
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.6)  # the running chat is past its TTL too: sweeps skip it
        assert [c.chat_id for c in (await agw.list_chats()).chats] == [stream.chat_id]
        gate.set()
        assert (await stream.result()).outcome == "complete"
        with pytest.raises(ChatNotFound):
            await agw.get_chat(old.chat_id)
