"""Two whole services sharing one PostgreSQL database, through the real gRPC transport.

What one replica recorded, the other reads: a chat started on A is continued on
B with its history, listed and shown on both, an ended run of A is re-attached
on B, a file uploaded through A is referenced by a query on B, ownership holds
across them, and stopping a service closes its pools.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import pytest
from agw.v1 import gateway_pb2 as gw

from service.assembly.config import ApiKeySettings
from service.providers.loopback import DONE, LoopbackProvider, content, finish
from service.testing import Harness, PostgresServer
from tests.transport.test_query import error_info

KEYS = [
    ApiKeySettings(key="key-alice-1234567890", tenant="acme", subject="alice"),
    ApiKeySettings(key="key-bob-1234567890", tenant="acme", subject="bob"),
]
ALICE = (("authorization", "Bearer key-alice-1234567890"),)
BOB = (("authorization", "Bearer key-bob-1234567890"),)


def answer(text: str) -> list[Any]:
    return [content(text), finish("stop"), DONE]


def on_postgres(dsn: str, **overrides: Any) -> dict[str, Any]:
    return {"chat_store": "postgres", "run_log": "postgres", "postgres_dsn": dsn, **overrides}


@pytest.fixture
async def replicas(
    agents_dir: Path, provider: LoopbackProvider, postgres_dsn: str
) -> AsyncIterator[tuple[Harness, Harness]]:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(
            Harness.start(agents_dir, provider, **on_postgres(postgres_dsn))
        )
        b = await stack.enter_async_context(
            Harness.start(agents_dir, provider, **on_postgres(postgres_dsn))
        )
        yield a, b


async def test_a_chat_started_on_one_replica_is_continued_on_another(
    replicas: tuple[Harness, Harness], provider: LoopbackProvider
) -> None:
    a, b = replicas
    provider.enqueue(answer("Nice to meet you, Ada."), answer("You are Ada."))
    first = await a.query("plain", "I am Ada.")
    chat_id = first[0].chat_id
    await a.app.frontdoor.flush()  # the run is fully recorded
    second = await b.query("plain", "Who am I?", chat_id=chat_id)
    assert [e.type for e in second][-1] == "run.complete"
    assert "chat.start" not in [e.type for e in second]  # B knows the chat exists
    assert provider.requests[1]["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "I am Ada."},
        {"role": "assistant", "content": "Nice to meet you, Ada."},
        {"role": "user", "content": "Who am I?"},
    ]
    await b.app.frontdoor.flush()
    for replica in (a, b):
        chat = await replica.stub.GetChat(
            gw.GetChatRequest(chat_id=chat_id, include_raw_messages=True)
        )
        assert chat.chat_name == "I am Ada."
        types = [e.type for e in chat.events]
        assert types.count("chat.start") == 1 and types.count("run.complete") == 2
        assert [(m["_type"], m["runId"]) for m in chat.raw_messages] == [
            ("query", first[0].run_id),
            ("step", first[0].run_id),
            ("query", second[0].run_id),
            ("step", second[0].run_id),
        ]
        listed = await replica.stub.ListChats(gw.ListChatsRequest())
        assert [(c.chat_id, c.run_count) for c in listed.chats] == [(chat_id, 2)]


async def test_an_ended_run_of_one_replica_is_attached_on_another(
    replicas: tuple[Harness, Harness], provider: LoopbackProvider
) -> None:
    a, b = replicas
    provider.enqueue(answer("one two three"))
    live = await a.query("plain", "go")
    await a.app.frontdoor.flush()  # the run's log is kept in the database
    run_id = live[0].run_id
    for after in range(len(live) + 1):
        request = gw.AttachRequest(run_id=run_id, after_seq=after)
        assert [e async for e in b.stub.Attach(request)] == live[after:]


async def test_a_file_uploaded_on_one_replica_is_referenced_on_another(
    tmp_path: Path, agents_dir: Path, provider: LoopbackProvider, postgres_dsn: str
) -> None:
    settings = on_postgres(postgres_dsn, auth_api_keys=KEYS)
    async with (  # each replica on a disk of its own: only the database is shared
        Harness.start(agents_dir, provider, data_dir=tmp_path / "a", **settings) as a,
        Harness.start(agents_dir, provider, data_dir=tmp_path / "b", **settings) as b,
    ):
        reply = await a.stub.Upload(
            gw.UploadRequest(name="notes.txt", content=b"the key is under the mat"),
            metadata=ALICE,
        )
        reference = reply.reference
        assert not (tmp_path / "a" / "uploads").exists()  # kept in the database
        provider.enqueue(answer("Under the mat."))
        request = gw.QueryRequest(agent_key="plain", message="Where is the key?")
        request.references.append(reference)
        events = [e async for e in b.stub.Query(request, metadata=ALICE)]
        assert events[0].request_query.references[0].id == reference.id
        assert events[-1].type == "run.complete"
        assert provider.requests[-1]["messages"][-1] == {
            "role": "user",
            "content": [
                {"type": "text", "text": "Where is the key?"},
                {"type": "text", "text": "[file notes.txt]\nthe key is under the mat"},
            ],
        }
        with pytest.raises(grpc.aio.AioRpcError) as caught:  # not Bob's upload, on any replica
            [e async for e in b.stub.Query(request, metadata=BOB)]
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert len(provider.requests) == 1


async def test_ownership_holds_across_replicas(
    agents_dir: Path, provider: LoopbackProvider, postgres_dsn: str
) -> None:
    settings = on_postgres(postgres_dsn, auth_api_keys=KEYS)
    async with (
        Harness.start(agents_dir, provider, **settings) as a,
        Harness.start(agents_dir, provider, **settings) as b,
    ):
        provider.enqueue(answer("hello"), answer("again"))
        request = gw.QueryRequest(agent_key="plain", message="mine")
        events = [e async for e in a.stub.Query(request, metadata=ALICE)]
        chat_id = events[0].chat_id
        await a.app.frontdoor.flush()
        assert [
            c.chat_id for c in (await b.stub.ListChats(gw.ListChatsRequest(), metadata=ALICE)).chats
        ] == [chat_id]
        assert not (await b.stub.ListChats(gw.ListChatsRequest(), metadata=BOB)).chats
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await b.stub.GetChat(gw.GetChatRequest(chat_id=chat_id), metadata=BOB)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            request = gw.QueryRequest(agent_key="plain", message="theirs", chat_id=chat_id)
            async for _ in b.stub.Query(request, metadata=BOB):
                pass
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        request = gw.QueryRequest(agent_key="plain", message="still mine", chat_id=chat_id)
        again = [e async for e in b.stub.Query(request, metadata=ALICE)]
        assert again[-1].type == "run.complete"


async def test_stopping_a_service_closes_its_connections(
    agents_dir: Path, provider: LoopbackProvider, postgres_dsn: str
) -> None:
    admin = await asyncpg.connect(postgres_dsn)
    count = (
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    try:
        async with Harness.start(agents_dir, provider, **on_postgres(postgres_dsn)) as gateway:
            provider.enqueue(answer("hi"))
            await gateway.query("plain", "hello")
            assert await admin.fetchval(count) >= 3  # a pool each: chats, run logs, uploads
        assert await admin.fetchval(count) == 0
    finally:
        await admin.close()


async def test_a_lost_database_is_a_store_failure_not_a_crash(
    agents_dir: Path,
    provider: LoopbackProvider,
    postgres_dsn: str,
    postgres_server: PostgresServer,
) -> None:
    async with Harness.start(agents_dir, provider, **on_postgres(postgres_dsn)) as gateway:
        provider.enqueue(answer("hi"))
        events = await gateway.query("plain", "hello")
        await gateway.app.frontdoor.flush()
        postgres_server.drop_database(postgres_dsn.rsplit("/", 1)[1])  # cuts every connection
        for call in (
            lambda: gateway.stub.GetChat(gw.GetChatRequest(chat_id=events[0].chat_id)),
            lambda: gateway.stub.ListChats(gw.ListChatsRequest()),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call()
            assert caught.value.code() == grpc.StatusCode.INTERNAL
            assert error_info(caught.value).reason == "STORE_FAILED"


async def test_a_database_that_stops_answering_is_a_prompt_store_failure(
    agents_dir: Path, provider: LoopbackProvider, postgres_dsn: str
) -> None:
    settings = on_postgres(postgres_dsn, postgres_timeout_s=1.0)
    async with Harness.start(agents_dir, provider, **settings) as gateway:
        provider.enqueue(answer("hi"))
        events = await gateway.query("plain", "hello")
        await gateway.app.frontdoor.flush()
        admin = await asyncpg.connect(postgres_dsn)
        try:
            backends = [  # the server processes of the service's connections
                row["pid"]
                for row in await admin.fetch(
                    "SELECT pid FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            ]
        finally:
            await admin.close()
        assert backends
        for pid in backends:
            os.kill(pid, signal.SIGSTOP)  # they hold their sockets and answer nothing
        try:
            began = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await gateway.stub.GetChat(gw.GetChatRequest(chat_id=events[0].chat_id))
            took = time.monotonic() - began
        finally:
            for pid in backends:
                os.kill(pid, signal.SIGCONT)
        assert caught.value.code() == grpc.StatusCode.INTERNAL
        assert error_info(caught.value).reason == "STORE_FAILED"
        assert "no answer in time" in caught.value.details()
        assert took < 3.0
        chat = await gateway.stub.GetChat(gw.GetChatRequest(chat_id=events[0].chat_id))
        assert chat.chat_name == "hello"  # served again


async def test_a_frozen_server_fails_each_call_within_the_timeout_and_serving_resumes(
    agents_dir: Path, provider: LoopbackProvider, postgres_dsn: str, postgres_server: PostgresServer
) -> None:
    timeout_s = 1.0
    settings = on_postgres(postgres_dsn, postgres_timeout_s=timeout_s)
    async with Harness.start(agents_dir, provider, **settings) as gateway:
        provider.enqueue(answer("hi"))
        events = await gateway.query("plain", "hello")
        chat_id = events[0].chat_id
        await gateway.app.frontdoor.flush()
        calls = {  # reading a chat, the chats; writing an upload; a query (it reads its chat)
            "GetChat": lambda: gateway.stub.GetChat(gw.GetChatRequest(chat_id=chat_id)),
            "ListChats": lambda: gateway.stub.ListChats(gw.ListChatsRequest()),
            "Upload": lambda: gateway.stub.Upload(gw.UploadRequest(name="a.txt", content=b"a")),
            "Query": lambda: gateway.query("plain", "again", chat_id=chat_id),
        }
        took: dict[str, float] = {}
        with postgres_server.frozen():  # the server and every backend: nothing answers
            for name, call in calls.items():
                began = time.monotonic()
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await call()
                took[name] = time.monotonic() - began
                assert caught.value.code() == grpc.StatusCode.INTERNAL, name
                assert error_info(caught.value).reason == "STORE_FAILED", name
                assert "no answer in time" in caught.value.details(), name
        assert all(timeout_s * 0.9 < t < timeout_s + 0.4 for t in took.values()), took
        chat = await gateway.stub.GetChat(gw.GetChatRequest(chat_id=chat_id))
        assert chat.chat_name == "hello"  # served again
        provider.enqueue(answer("back"))
        again = await gateway.query("plain", "again", chat_id=chat_id)
        assert again[-1].type == "run.complete"
