"""Chat memory through the real service: records, memory, history, re-attach, policies, uploads."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from pathlib import Path

import grpc
import pytest
from agw.v1 import gateway_pb2 as gw
from google.protobuf import json_format

from service.core.chats.history import snapshot_form
from service.providers.loopback import (
    CLOSE,
    DONE,
    Gate,
    HttpError,
    LoopbackProvider,
    content,
    finish,
    reasoning,
    usage,
)
from service.testing import Harness

GOLDEN = Path(__file__).parent / "golden"
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 32


def answer(text: str, think: str = "") -> list:
    script: list = [reasoning(think)] if think else []
    return [*script, content(text), finish("stop"), usage(10, 5), DONE]


def normalized_jsonl(path: Path) -> str:
    """The chat file with run-specific values (ids, times) replaced by stable names."""
    text = path.read_text()
    names: dict[str, str] = {}

    def name(kind: str, value: str) -> str:
        return names.setdefault(value, f"<{kind}{len([k for k in names if k.startswith(kind)])}>")

    records = [json.loads(line) for line in text.splitlines()]
    out = []
    for record in records:
        dumped = json.dumps(record, ensure_ascii=False, sort_keys=True)
        dumped = re.sub(r'"(updatedAt|ts)": \d+', r'"\1": 0', dumped)
        dumped = re.sub(r'"timestamp": "\d+"', '"timestamp": "0"', dumped)
        dumped = re.sub(r'"(firstDeltaMs|durationMs)": [\d.]+', r'"\1": 0', dumped)
        for pattern, kind in (
            (r"m_[0-9a-f]{8}", "msg"),
            (r"\b[pta]_[0-9a-f]{8}\b", "tid"),
            (r"(?<![0-9a-f])[0-9a-f]{16}(?![0-9a-f])", "run"),
            (r"[0-9a-f]{8}-[0-9a-f-]{27}", "id"),
        ):
            dumped = re.sub(pattern, lambda m, kind=kind: name(kind, m.group(0)), dumped)
        out.append(dumped)
    return "\n".join(out) + "\n"


def chat_file(gateway: Harness, chat_id: str) -> Path:
    return gateway.app.settings.chats_path / f"{chat_id}.json"


def assert_golden(actual: str, name: str) -> None:
    path = GOLDEN / name
    if os.environ.get("AGW_UPDATE_GOLDEN"):  # rewrite after a deliberate format change
        path.write_text(actual)
    assert actual == path.read_text()


async def test_oneshot_run_writes_the_expected_jsonl(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(answer("Hi!", think="Greeting."))
    events = await gateway.query("thinker", "Hello", request_id="req-1")
    await gateway.app.frontdoor.flush()
    assert_golden(normalized_jsonl(chat_file(gateway, events[0].chat_id)), "oneshot.jsonl")


async def test_the_model_remembers_earlier_runs_without_reasoning(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(answer("Nice to meet you, Ada.", think="Name is Ada."), answer("Ada."))
    first = await gateway.query("thinker", "I am Ada.")
    await gateway.query("thinker", "Who am I?", chat_id=first[0].chat_id)
    assert provider.requests[1]["messages"] == [
        {"role": "system", "content": "Think first."},
        {"role": "user", "content": "I am Ada."},
        {"role": "assistant", "content": "Nice to meet you, Ada."},
        {"role": "user", "content": "Who am I?"},
    ]


async def test_memory_window_counts_runs(agents_dir: Path, provider: LoopbackProvider) -> None:
    async with Harness.start(agents_dir, provider, memory_runs=2) as gateway:
        chat = ""
        for n in range(4):
            provider.enqueue(answer(f"a{n}"))
            events = await gateway.query("plain", f"q{n}", chat_id=chat)
            chat = events[0].chat_id
        assert [m["content"] for m in provider.requests[3]["messages"]] == [
            "You are terse.",
            "q1",
            "a1",
            "q2",
            "a2",
            "q3",
        ]


async def test_a_partial_answer_of_a_failed_run_is_remembered(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue([content("Partial"), CLOSE])  # the provider cuts the stream
    first = await gateway.query("plain", "one")
    assert first[-1].type == "run.error"
    provider.enqueue([HttpError(503, "down")])
    second = await gateway.query("plain", "two", chat_id=first[0].chat_id)
    assert second[-1].type == "run.error"
    provider.enqueue(answer("ok"))
    await gateway.query("plain", "three", chat_id=first[0].chat_id)
    assert provider.requests[-1]["messages"][1:] == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "Partial"},
        {"role": "user", "content": "two"},
        {"role": "user", "content": "three"},
    ]


async def test_get_chat_replays_the_snapshot_form_of_the_live_streams(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(answer("One.", think="Hm."), answer("Two."), [HttpError(500, "boom")])
    live = await gateway.query("thinker", "first")
    chat_id = live[0].chat_id
    live += await gateway.query("thinker", "second", chat_id=chat_id)
    live += await gateway.query("thinker", "third", chat_id=chat_id)
    await gateway.app.frontdoor.flush()
    reply = await gateway.stub.GetChat(gw.GetChatRequest(chat_id=chat_id))

    def comparable(events) -> list[dict]:
        out = []
        for event in events:
            data = json_format.MessageToDict(event)
            for key in ("seq", "timestamp"):
                data.pop(key, None)
            out.append(data)
        return out

    expected = snapshot_form(live)
    assert comparable(reply.events) == comparable(expected)
    assert [e.seq for e in reply.events] == list(range(1, len(reply.events) + 1))
    types = [e.type for e in reply.events]
    assert types.count("chat.start") == 1
    assert types.count("run.start") == 3
    assert types[-1] == "run.error"
    assert "reasoning.snapshot" in types and "content.delta" not in types
    assert reply.chat_name == "first"
    assert not reply.raw_messages
    raw = await gateway.stub.GetChat(gw.GetChatRequest(chat_id=chat_id, include_raw_messages=True))
    assert [m["_type"] for m in raw.raw_messages][:2] == ["query", "step"]


async def test_list_chats_newest_first_paged_and_get_chat_errors(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    for n in range(3):
        provider.enqueue(answer("ok"))
        await gateway.query("plain", f"chat number {n}")
    page = await gateway.stub.ListChats(gw.ListChatsRequest(page_size=2))
    assert [c.chat_name for c in page.chats] == ["chat number 2", "chat number 1"]
    assert page.chats[0].run_count == 1 and page.chats[0].agent_key == "plain"
    rest = await gateway.stub.ListChats(
        gw.ListChatsRequest(page_size=2, page_token=page.next_page_token)
    )
    assert [c.chat_name for c in rest.chats] == ["chat number 0"] and not rest.next_page_token
    for request, code in (
        (gw.GetChatRequest(chat_id="missing"), grpc.StatusCode.NOT_FOUND),
        (gw.GetChatRequest(chat_id=""), grpc.StatusCode.INVALID_ARGUMENT),
        (gw.GetChatRequest(chat_id="../x"), grpc.StatusCode.INVALID_ARGUMENT),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await gateway.stub.GetChat(request)
        assert caught.value.code() == code


async def attach(gateway: Harness, run_id: str, after: int) -> list:
    return [e async for e in gateway.stub.Attach(gw.AttachRequest(run_id=run_id, after_seq=after))]


async def test_a_chat_is_listed_newest_and_complete_once_its_run_has_ended(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    for n in range(6):
        provider.enqueue(answer(f"answer {n}"))
        request = gw.QueryRequest(agent_key="plain", message=f"Chat {n}")
        events = [e async for e in gateway.stub.Query(request)]
        newest = (await gateway.stub.ListChats(gw.ListChatsRequest(page_size=1))).chats
        assert [(c.chat_id, c.chat_name, c.run_count) for c in newest] == [
            (events[0].chat_id, f"Chat {n}", 1)
        ]
        assert newest[0].updated_at >= events[-1].timestamp


async def test_attach_from_every_seq_of_a_recorded_run(
    agents_dir: Path, provider: LoopbackProvider
) -> None:
    async with Harness.start(agents_dir, provider, run_retention_s=0.2) as gateway:
        provider.enqueue(answer("a b c", think="x y"))
        live = await gateway.query("thinker", "go")
        run_id = live[0].run_id
        for after in range(len(live) + 1):
            assert await attach(gateway, run_id, after) == live[after:]
        await gateway.app.frontdoor.flush()
        await asyncio.sleep(0.3)  # past the retention: served from the archive now
        assert run_id not in gateway.app.frontdoor.runs
        for after in range(len(live) + 1):
            assert await attach(gateway, run_id, after) == live[after:]
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await attach(gateway, "0123456789abcdef", 0)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_attach_at_every_seq_while_live_has_no_gap_or_duplicate(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    gates = [asyncio.Event() for _ in range(4)]
    script: list = []
    for n, gate in enumerate(gates):
        script += [content(f"w{n} "), Gate(gate)]
    provider.enqueue([*script, finish("stop"), DONE])
    call = gateway.stub.Query(gw.QueryRequest(agent_key="plain", message="go"))
    followers: list[asyncio.Task] = []
    seen = []
    released = 0
    async for event in call:
        seen.append(event)
        followers.append(asyncio.create_task(attach(gateway, event.run_id, event.seq)))
        if event.type == "content.delta":
            gates[released].set()
            released += 1
    for follower, event in zip(followers, seen, strict=True):
        assert await follower == seen[event.seq :]


async def test_a_disconnected_client_does_not_stop_the_run(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue([content("before "), Gate(gate), content("after"), finish("stop"), DONE])
    call = gateway.stub.Query(gw.QueryRequest(agent_key="plain", message="go"))
    async for event in call:
        if event.type == "content.delta":
            break
    call.cancel()
    run = gateway.app.frontdoor.get_run(event.run_id)
    await asyncio.sleep(0.05)
    assert not run.done
    gate.set()
    await asyncio.wait_for(run.wait(), 5)
    rejoined = await attach(gateway, event.run_id, event.seq)
    assert [e.type for e in rejoined] == ["content.delta", "content.end", "run.complete"]


async def test_a_run_nobody_watches_is_cancelled_after_its_ttl(
    agents_dir: Path, provider: LoopbackProvider
) -> None:
    async with Harness.start(agents_dir, provider, unwatched_run_ttl_s=0.2) as gateway:
        provider.enqueue([content("x"), Gate(asyncio.Event())])
        call = gateway.stub.Query(gw.QueryRequest(agent_key="plain", message="go"))
        async for event in call:
            if event.type == "content.delta":
                break
        call.cancel()
        run = gateway.app.frontdoor.get_run(event.run_id)
        await asyncio.wait_for(run.wait(), 5)
        assert run.log[-1].run_cancel.reason == "abandoned"


async def _busy_chat(gateway: Harness, provider: LoopbackProvider) -> tuple:
    gate = asyncio.Event()
    provider.enqueue([content("first"), Gate(gate), finish("stop"), DONE], answer("second"))
    first = gateway.stub.Query(gw.QueryRequest(agent_key="plain", message="one"))
    events = []
    async for event in first:
        events.append(event)
        if event.type == "content.delta":
            break
    return first, events, gate


async def test_concurrent_query_on_a_busy_chat_is_rejected_by_default(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    first, events, gate = await _busy_chat(gateway, provider)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await gateway.query("plain", "two", chat_id=events[0].chat_id)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert events[0].run_id in caught.value.details()
    gate.set()
    assert [e.type async for e in first][-1] == "run.complete"


async def test_enqueue_waits_for_the_active_run(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    first, events, gate = await _busy_chat(gateway, provider)
    second = asyncio.create_task(
        gateway.query(
            "plain",
            "two",
            chat_id=events[0].chat_id,
            multitask_strategy=gw.MULTITASK_STRATEGY_ENQUEUE,
        )
    )
    await asyncio.sleep(0.1)
    assert not second.done()
    gate.set()
    rest = [e async for e in first]
    queued = await second
    assert rest[-1].type == "run.complete" and queued[-1].type == "run.complete"
    assert queued[0].timestamp >= rest[-1].timestamp
    assert provider.requests[1]["messages"][-3:] == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "first"},
        {"role": "user", "content": "two"},
    ]


async def test_interrupt_cancels_the_active_run(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    first, events, _gate = await _busy_chat(gateway, provider)
    second = await gateway.query(
        "plain",
        "two",
        chat_id=events[0].chat_id,
        multitask_strategy=gw.MULTITASK_STRATEGY_INTERRUPT,
    )
    rest = [e async for e in first]
    assert rest[-1].type == "run.cancel" and rest[-1].run_cancel.reason == "interrupt"
    assert second[-1].type == "run.complete"


async def test_upload_then_query_with_the_image(
    agents_dir: Path, provider: LoopbackProvider
) -> None:
    async with Harness.start(agents_dir, provider, upload_max_bytes=1000) as gateway:
        reply = await gateway.stub.Upload(
            gw.UploadRequest(request_id="u1", name="pic.png", content=PNG)
        )
        ref = reply.reference
        assert ref.id.startswith("f_") and ref.type == "image" and ref.mime_type == "image/png"
        assert ref.sha256 == hashlib.sha256(PNG).hexdigest() and ref.size_bytes == len(PNG)
        assert reply.event.type == "request.upload"
        assert reply.event.request_upload.upload.sha256 == ref.sha256
        assert reply.event.request_upload.request_id == "u1"

        gateway.app.settings.providers["fake"].image_input = True
        provider.enqueue(answer("A picture."))
        await gateway.query("plain", "What is this?", references=[ref])
        user = provider.requests[-1]["messages"][-1]
        assert user["content"][0] == {"type": "text", "text": "What is this?"}
        assert user["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")

        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await gateway.stub.Upload(gw.UploadRequest(name="big.bin", content=b"x" * 1001))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "1000" in caught.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await gateway.stub.Upload(gw.UploadRequest(name="../evil", content=b"x"))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            missing = gw.QueryRequest(agent_key="plain", message="x")
            missing.references.add(id="f_0000000000000000")
            [e async for e in gateway.stub.Query(missing)]
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_chat_beyond_the_context_budget_is_truncated_by_whole_turns(
    agents_dir: Path, provider: LoopbackProvider
) -> None:
    async with Harness.start(agents_dir, provider, context_max_tokens=60) as gateway:
        chat = ""
        for n in range(3):
            provider.enqueue(answer(f"answer {n} " + " ".join(["xx"] * 27)))
            events = await gateway.query("plain", f"question {n}", chat_id=chat)
            chat = events[0].chat_id
    compress = [e.context_compress for e in events if e.type == "context.compress"]
    assert len(compress) == 1
    assert compress[0].strategy == "truncate"
    assert (compress[0].messages_before, compress[0].messages_after) == (4, 2)
    assert compress[0].tokens_after <= 60 < compress[0].tokens_before
    assert [m["content"][:10] for m in provider.requests[2]["messages"]] == [
        "You are te",
        "question 1",
        "answer 1 x",
        "question 2",
    ]
