"""OpenAIChatClient against the loopback server: real sockets, real aiohttp, no mocks."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from service.core.errors import ProviderError, ProviderNotConfigured, ProviderTimeout
from service.core.model import (
    ModelClient,
    ModelDelta,
    ModelRequest,
    Reasoning,
    ToolCallDelta,
    Usage,
)
from service.providers.interaction_log import LoggedModel
from service.providers.loopback import (
    CLOSE,
    DONE,
    Gate,
    HttpError,
    LoopbackProvider,
    Pause,
    content,
    error_chunk,
    finish,
    reasoning,
    tool_call,
    tool_call_part,
    tool_calls,
    usage,
)
from service.providers.openai import OpenAIChatClient, ProviderOptions
from service.providers.registry import ProviderRegistry

SECRET = "sk-fake-SECRET-4242"


@pytest.fixture
async def server() -> AsyncIterator[LoopbackProvider]:
    async with LoopbackProvider() as s:
        yield s


def make_client(server: LoopbackProvider, **overrides: Any) -> OpenAIChatClient:
    values: dict[str, Any] = {"api_key": SecretStr(SECRET), "retry_backoff_s": 0.01}
    values.update(overrides)
    return OpenAIChatClient("fake", ProviderOptions(base_url=server.url, **values))


@pytest.fixture
async def client(server: LoopbackProvider) -> AsyncIterator[OpenAIChatClient]:
    c = make_client(server)
    yield c
    await c.aclose()


def req(**kw: Any) -> ModelRequest:
    return ModelRequest(
        provider="fake", model="m", messages=[{"role": "user", "content": "hi"}], **kw
    )


def req_with(text: str) -> ModelRequest:
    return ModelRequest(provider="fake", model="m", messages=[{"role": "user", "content": text}])


async def collect(client: ModelClient, request: ModelRequest | None = None) -> list[ModelDelta]:
    async with client.stream(request or req()) as deltas:
        return [d async for d in deltas]


async def collect_until_error(
    client: OpenAIChatClient,
) -> tuple[list[ModelDelta], ProviderError]:
    got: list[ModelDelta] = []
    with pytest.raises(ProviderError) as info:
        async with client.stream(req()) as deltas:
            async for d in deltas:
                got.append(d)
    return got, info.value


def sse(obj: dict[str, Any], end: bytes = b"\n\n") -> bytes:
    return b"data: " + json.dumps(obj).encode() + end


# -- happy paths -----------------------------------------------------------------------


async def test_content_only(server: LoopbackProvider, client: OpenAIChatClient) -> None:
    server.enqueue([content("Hel"), content("lo"), finish("stop"), DONE])
    assert await collect(client) == [
        ModelDelta(content="Hel"),
        ModelDelta(content="lo"),
        ModelDelta(finish_reason="stop"),
    ]


async def test_reasoning_then_content_skips_empty_chunks(
    server: LoopbackProvider, client: OpenAIChatClient
) -> None:
    role_only = content("")
    role_only["choices"][0]["delta"] = {"role": "assistant", "content": ""}
    alt = content("")
    alt["choices"][0]["delta"] = {"reasoning": "also thinking"}
    server.enqueue([role_only, reasoning("think"), alt, content("answer"), finish("stop"), DONE])
    assert await collect(client) == [
        ModelDelta(reasoning="think"),
        ModelDelta(reasoning="also thinking"),
        ModelDelta(content="answer"),
        ModelDelta(finish_reason="stop"),
    ]


async def test_usage_chunk(server: LoopbackProvider, client: OpenAIChatClient) -> None:
    cached = usage(12, 8, reasoning_tokens=3)
    cached["usage"]["prompt_tokens_details"]["cached_tokens"] = 4
    server.enqueue([content("x"), finish("stop"), cached, DONE])
    deltas = await collect(client)
    assert deltas[-1] == ModelDelta(usage=Usage(12, 8, 20, 3, 4))


async def test_tool_call_fragments_and_parallel_calls(
    server: LoopbackProvider, client: OpenAIChatClient
) -> None:
    server.enqueue(
        [
            tool_call(0, id="call_a", name="get_weather"),
            tool_call(0, arguments='{"city":'),
            tool_call(0, arguments=' "Paris"}'),
            tool_calls(
                tool_call_part(1, id="call_b", name="get_time", arguments='{"tz"'),
                tool_call_part(2, id="call_c", name="noop", arguments="{}"),
            ),
            tool_call(1, arguments=': "UTC"}'),
            tool_call(1, arguments=""),  # carries nothing: skipped
            finish("tool_calls"),
            DONE,
        ]
    )
    assert await collect(client) == [
        ModelDelta(tool_calls=(ToolCallDelta(0, "call_a", "get_weather", ""),)),
        ModelDelta(tool_calls=(ToolCallDelta(0, arguments='{"city":'),)),
        ModelDelta(tool_calls=(ToolCallDelta(0, arguments=' "Paris"}'),)),
        ModelDelta(
            tool_calls=(
                ToolCallDelta(1, "call_b", "get_time", '{"tz"'),
                ToolCallDelta(2, "call_c", "noop", "{}"),
            )
        ),
        ModelDelta(tool_calls=(ToolCallDelta(1, arguments=': "UTC"}'),)),
        ModelDelta(finish_reason="tool_calls"),
    ]


async def test_comment_lines(server: LoopbackProvider, client: OpenAIChatClient) -> None:
    server.enqueue([b": keep-alive\n\n", content("a"), b":ping\n", content("b"), b": x\n\n", DONE])
    assert [d.content for d in await collect(client)] == ["a", "b"]


async def test_crlf_and_splits_across_writes(
    server: LoopbackProvider, client: OpenAIChatClient
) -> None:
    raw = sse(content("a"), b"\r\n\r\n") + sse(content("b"), b"\r\n")
    c = sse(content("c"), b"\r")
    end = [sse(finish("stop"), b"\r\r"), b"data: [DONE]\r\n\r\n"]
    server.enqueue([raw, b"\r", b"\n", c[:9], c[9:], b"\n\r\n", *end])
    assert [d.content or d.finish_reason for d in await collect(client)] == ["a", "b", "c", "stop"]


async def test_connection_is_reused(server: LoopbackProvider, client: OpenAIChatClient) -> None:
    for _ in range(3):
        server.enqueue([content("x"), finish("stop"), usage(1, 1), DONE])
        await collect(client)
    assert len(server.requests) == 3
    assert server.connections_opened == 1


# -- end of stream -----------------------------------------------------------------------


@pytest.mark.parametrize("ending", [[CLOSE], []], ids=["close", "clean-eof"])
async def test_missing_done_after_finish_ends_normally(
    server: LoopbackProvider, client: OpenAIChatClient, ending: list[Any]
) -> None:
    server.enqueue([content("a"), finish("stop"), *ending])
    assert await collect(client) == [ModelDelta(content="a"), ModelDelta(finish_reason="stop")]


@pytest.mark.parametrize("ending", [[CLOSE], []], ids=["close", "clean-eof"])
async def test_missing_done_without_finish_fails(
    server: LoopbackProvider, client: OpenAIChatClient, ending: list[Any]
) -> None:
    server.enqueue([content("a"), *ending])
    got, err = await collect_until_error(client)
    assert got == [ModelDelta(content="a")]
    assert "stream ended before completion" in str(err)
    assert "fake" in str(err)
    assert len(server.requests) == 1  # never retried after the first byte


async def test_invalid_json_is_an_error(server: LoopbackProvider, client: OpenAIChatClient) -> None:
    server.enqueue([content("a"), b"data: {not json\n\n", DONE])
    got, err = await collect_until_error(client)
    assert got == [ModelDelta(content="a")]
    assert "invalid JSON" in str(err)


async def test_error_object_mid_stream(server: LoopbackProvider, client: OpenAIChatClient) -> None:
    server.enqueue([content("a"), error_chunk("model overloaded", code="overloaded"), DONE])
    got, err = await collect_until_error(client)
    assert got == [ModelDelta(content="a")]
    assert err.reason == "PROVIDER_STREAM_ERROR"
    assert "model overloaded" in str(err) and "fake" in str(err)


# -- errors and retries -----------------------------------------------------------------


async def test_429_is_retried_then_succeeds(server: LoopbackProvider) -> None:
    client = make_client(server, retry_backoff_s=5.0)  # Retry-After wins over back-off
    server.enqueue(
        [HttpError(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "0.2"})],
        [content("ok"), finish("stop"), DONE],
    )
    start = time.monotonic()
    try:
        deltas = await collect(client)
    finally:
        await client.aclose()
    assert 0.2 <= time.monotonic() - start < 2.0
    assert [d.content for d in deltas if d.content] == ["ok"]
    assert len(server.requests) == 2


async def test_a_retry_after_beyond_the_cap_is_not_retried(server: LoopbackProvider) -> None:
    options = ProviderOptions(base_url=server.url, retry_backoff_s=0.01, max_retry_after_s=0.05)
    client = OpenAIChatClient("fake", options)
    server.enqueue(
        [HttpError(503, "busy", headers={"Retry-After": "3600"})], [finish("stop"), DONE]
    )
    start = time.monotonic()
    try:
        with pytest.raises(ProviderError) as info:
            await collect(client)
    finally:
        await client.aclose()
    assert time.monotonic() - start < 1.0
    assert len(server.requests) == 1
    assert info.value.status == 503 and not info.value.retryable
    assert "Retry-After 3600 s exceeds the retry cap of 0.05 s" in str(info.value)


async def test_back_off_is_capped_by_max_retry_after_s(server: LoopbackProvider) -> None:
    options = ProviderOptions(base_url=server.url, retry_backoff_s=60, max_retry_after_s=0.05)
    client = OpenAIChatClient("fake", options)
    server.enqueue([HttpError(503, "busy")], [finish("stop"), DONE])
    start = time.monotonic()
    try:
        await collect(client)
    finally:
        await client.aclose()
    assert time.monotonic() - start < 1.0
    assert len(server.requests) == 2


async def test_500_on_every_attempt(server: LoopbackProvider) -> None:
    client = make_client(server, max_retries=2)
    server.enqueue(*[[HttpError(500, {"error": {"message": "upstream boom"}})]] * 3)
    with pytest.raises(ProviderError) as info:
        await collect(client)
    await client.aclose()
    err = info.value
    assert err.status == 500 and err.retryable
    assert "'fake'" in str(err) and "500" in str(err) and "upstream boom" in str(err)
    assert len(server.requests) == 3


async def test_400_is_not_retried(server: LoopbackProvider, client: OpenAIChatClient) -> None:
    server.enqueue([HttpError(400, {"error": {"message": "bad model"}})], [content("never")])
    with pytest.raises(ProviderError) as info:
        await collect(client)
    assert info.value.status == 400 and not info.value.retryable
    assert "bad model" in str(info.value)
    assert len(server.requests) == 1


async def test_text_error_body_is_truncated(
    server: LoopbackProvider, client: OpenAIChatClient
) -> None:
    server.enqueue([HttpError(401, "x" * 5000)])
    with pytest.raises(ProviderError) as info:
        await collect(client)
    assert info.value.status == 401
    assert len(str(info.value)) < 700


async def test_connect_error_is_retried_then_reported() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = ProviderOptions(
        base_url=f"http://127.0.0.1:{port}/v1", max_retries=2, retry_backoff_s=0.01
    )
    client = OpenAIChatClient("dead", options)
    with pytest.raises(ProviderError) as info:
        await collect(client)
    await client.aclose()
    assert "'dead'" in str(info.value) and info.value.retryable


async def test_stall_mid_stream_is_a_timeout(server: LoopbackProvider) -> None:
    client = make_client(server, read_timeout_s=0.2)
    server.enqueue([content("a"), Pause(2.0), content("b"), DONE])
    try:
        got, err = await collect_until_error(client)
    finally:
        await client.aclose()
    assert got == [ModelDelta(content="a")]
    assert isinstance(err, ProviderTimeout) and err.reason == "PROVIDER_TIMEOUT"
    assert len(server.requests) == 1


async def test_a_provider_that_keeps_sending_never_times_out(server: LoopbackProvider) -> None:
    client = make_client(server, read_timeout_s=0.3)
    script: list[Any] = []
    for piece in "abcdef":  # 0.6 s in all, never 0.3 s without a byte
        script += [content(piece), Pause(0.1)]
    server.enqueue([*script, finish("stop"), DONE])
    try:
        deltas = await collect(client)
    finally:
        await client.aclose()
    assert "".join(d.content or "" for d in deltas) == "abcdef"
    assert deltas[-1] == ModelDelta(finish_reason="stop")


async def test_the_read_time_out_counts_only_while_a_read_waits(
    server: LoopbackProvider,
) -> None:
    # The provider is silent for 0.8 s after "a"; the consumer is away for 0.5 s of it
    # (e.g. writing "a" to a slow client), so its next read waits 0.3 s: within 0.5 s.
    client = make_client(server, read_timeout_s=0.5)
    server.enqueue([content("a"), Pause(0.8), content("b"), finish("stop"), DONE])
    got: list[ModelDelta] = []
    try:
        async with client.stream(req()) as deltas:
            async for d in deltas:
                got.append(d)
                if d.content == "a":
                    await asyncio.sleep(0.5)
    finally:
        await client.aclose()
    assert got == [
        ModelDelta(content="a"),
        ModelDelta(content="b"),
        ModelDelta(finish_reason="stop"),
    ]


async def test_stall_before_first_byte_is_retried(server: LoopbackProvider) -> None:
    client = make_client(server, read_timeout_s=0.2, max_retries=1)
    server.enqueue([Pause(2.0), content("late")], [content("ok"), finish("stop"), DONE])
    try:
        deltas = await collect(client)
    finally:
        await client.aclose()
    assert deltas[0] == ModelDelta(content="ok")
    assert len(server.requests) == 2


async def test_no_retry_after_first_byte(
    server: LoopbackProvider, client: OpenAIChatClient
) -> None:
    server.enqueue([content("partial"), CLOSE], [content("duplicate!")])
    got, err = await collect_until_error(client)
    assert got == [ModelDelta(content="partial")]
    assert "stream ended before completion" in str(err)
    assert len(server.requests) == 1


# -- streaming and cancellation ---------------------------------------------------------


async def test_strict_streaming(server: LoopbackProvider, client: OpenAIChatClient) -> None:
    gate = asyncio.Event()
    server.enqueue([content("first"), Gate(gate), content("second"), finish("stop"), DONE])
    async with client.stream(req()) as deltas:
        it = aiter(deltas)
        first = await asyncio.wait_for(anext(it), 2.0)
        assert first.content == "first" and not gate.is_set()
        gate.set()
        rest = [d async for d in it]
    assert [d.content or d.finish_reason for d in rest] == ["second", "stop"]


async def test_cancel_closes_upstream_within_100ms(
    server: LoopbackProvider, client: OpenAIChatClient
) -> None:
    never = asyncio.Event()
    server.enqueue([content("first"), Gate(never), content("never")])
    got_first = asyncio.Event()

    async def consume() -> None:
        async with client.stream(req()) as deltas:
            async for _ in deltas:
                got_first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_first.wait(), 2.0)
    assert server.disconnects == 0
    start = time.monotonic()
    task.cancel()
    await server.wait_disconnects(1, timeout=0.1)
    assert time.monotonic() - start < 0.1
    with pytest.raises(asyncio.CancelledError):
        await task
    await server.wait_closed_connections(timeout=1.0)
    # The pool is still healthy afterwards.
    server.enqueue([content("again"), finish("stop"), DONE])
    assert (await collect(client))[0].content == "again"


async def test_cancel_before_first_byte_closes_upstream(server: LoopbackProvider) -> None:
    client = make_client(server, max_connections=1)
    server.enqueue([Gate(asyncio.Event()), content("never")])
    task = asyncio.create_task(collect(client))
    await server._wait(lambda: len(server.requests) == 1, 2.0, "request")
    task.cancel()
    await server.wait_disconnects(1, timeout=0.1)
    with pytest.raises(asyncio.CancelledError):
        await task
    server.enqueue([content("ok"), finish("stop"), DONE])
    try:
        assert (await asyncio.wait_for(collect(client), 2.0))[0].content == "ok"
    finally:
        await client.aclose()


async def test_double_cancel_does_not_leak_the_pool_slot(server: LoopbackProvider) -> None:
    client = make_client(server, max_connections=1, read_timeout_s=2.0)
    for round_ in range(3):
        got_first = asyncio.Event()
        server.enqueue([content("a"), Gate(asyncio.Event())])

        async def consume(flag: asyncio.Event = got_first) -> None:
            async with client.stream(req()) as deltas:
                async for _ in deltas:
                    flag.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(got_first.wait(), 2.0)
        task.cancel()
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await server.wait_disconnects(round_ + 1, timeout=0.5)
    server.enqueue([content("ok"), finish("stop"), DONE])
    try:
        assert (await asyncio.wait_for(collect(client), 2.0))[0].content == "ok"
    finally:
        await client.aclose()


async def test_leaving_the_block_early_closes_upstream(
    server: LoopbackProvider, client: OpenAIChatClient
) -> None:
    server.enqueue([content("a"), Gate(asyncio.Event())])
    async with client.stream(req()) as deltas:
        async for _ in deltas:
            break
    await server.wait_disconnects(1, timeout=0.5)


async def test_chunks_received_before_a_cut_are_delivered(
    server: LoopbackProvider, client: OpenAIChatClient
) -> None:
    gate = asyncio.Event()
    server.enqueue([content("a"), Gate(gate), content("b"), finish("stop"), CLOSE])
    got: list[ModelDelta] = []
    async with client.stream(req()) as deltas:
        async for d in deltas:
            got.append(d)
            if d.content == "a":  # stop reading while the rest arrives and the provider cuts
                gate.set()
                await server.wait_closed_connections()
                await asyncio.sleep(0.05)  # lets the client see the cut; shorter only tests less
    assert got == [
        ModelDelta(content="a"),
        ModelDelta(content="b"),
        ModelDelta(finish_reason="stop"),
    ]


@pytest.mark.parametrize("stage", ["waiting-for-a-slot", "before-the-head", "draining-after-done"])
async def test_double_cancel_at_every_stage_keeps_a_pool_of_one(stage: str) -> None:
    never = asyncio.Event()

    async def respond(body: dict[str, Any]) -> Any:
        text = body["messages"][0]["content"]
        if text == "ok":
            return [content("ok"), finish("stop"), DONE]
        if text == "hold":
            return [content("held"), Gate(never)]
        if text == "before-the-head":
            await never.wait()  # the response head is never sent
        return [sse(finish("stop")) + b"data: [DONE]\n\n", Gate(never)]  # no end of body

    finished = asyncio.Event()

    async def consume(text: str) -> None:
        async with pooled.stream(req_with(text)) as deltas:
            async for d in deltas:
                if d.finish_reason:
                    finished.set()  # [DONE] comes next: the client drains the body

    async with LoopbackProvider(respond) as server:
        pooled = make_client(server, max_connections=1, read_timeout_s=5.0)
        try:
            holder = asyncio.create_task(consume("hold"))
            if stage != "waiting-for-a-slot":
                holder.cancel()
            task = asyncio.create_task(consume(stage))
            if stage == "waiting-for-a-slot":
                await server._wait(lambda: len(server.requests) == 1, 2.0, "request")
                await asyncio.sleep(0)  # one loop turn: the task now waits for the only slot
            elif stage == "before-the-head":
                await server._wait(lambda: len(server.requests) == 1, 2.0, "request")
            else:
                await asyncio.wait_for(finished.wait(), 2.0)
            task.cancel()
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            holder.cancel()
            with pytest.raises(asyncio.CancelledError):
                await holder
            if stage != "before-the-head":  # (there the server does not watch the connection)
                await server.wait_connections(at_most=0, timeout=1.0)
            deltas = await asyncio.wait_for(collect(pooled, req_with("ok")), 2.0)
            assert deltas[0].content == "ok"
        finally:
            await pooled.aclose()


async def test_a_woken_then_cancelled_waiter_passes_the_slot_on(server: LoopbackProvider) -> None:
    client = make_client(server, max_connections=1, read_timeout_s=5.0)
    server.enqueue([content("a"), Gate(asyncio.Event())], [content("c"), finish("stop"), DONE])
    try:
        async with client.stream(req()) as deltas:
            await anext(aiter(deltas))
            b = asyncio.create_task(collect(client))
            c = asyncio.create_task(collect(client))
            await asyncio.sleep(0)  # one loop turn: both now wait for the only slot
        b.cancel()  # the exit above woke it; it is cancelled before it runs
        assert (await asyncio.wait_for(c, 1.0))[0].content == "c"
        with pytest.raises(asyncio.CancelledError):
            await b
    finally:
        await client.aclose()


async def test_waiting_for_a_slot_times_out(server: LoopbackProvider) -> None:
    client = make_client(server, max_connections=1, read_timeout_s=0.2)
    server.enqueue([content("a"), Gate(asyncio.Event())])
    try:
        async with client.stream(req()) as deltas:
            await anext(aiter(deltas))
            with pytest.raises(ProviderTimeout) as info:
                await collect(client)
    finally:
        await client.aclose()
    assert "no free connection within 0.2s" in str(info.value)
    assert len(server.requests) == 1


async def test_many_cancellations_keep_a_pool_of_one() -> None:
    never = asyncio.Event()

    def respond(body: dict[str, Any]) -> Any:
        text = body["messages"][0]["content"]
        if text == "ok":
            return [content("ok"), finish("stop"), DONE]
        return [content(text), Gate(never)]

    async def consume(i: int) -> None:
        async with pooled.stream(req_with(f"c{i}")) as deltas:
            async for _ in deltas:
                pass

    rng = random.Random(7)
    async with LoopbackProvider(respond) as server:
        pooled = make_client(server, max_connections=1, read_timeout_s=5.0)
        try:
            tasks = [asyncio.create_task(consume(i)) for i in range(40)]
            while pending := [t for t in tasks if not t.done()]:
                for _ in range(rng.randint(0, 12)):  # connecting, head, body: any stage
                    await asyncio.sleep(0)
                # Mostly the oldest (it holds the slot, or is next), else one waiting for it.
                victim = pending[0] if rng.random() < 0.7 else rng.choice(pending)
                victim.cancel()
                if rng.random() < 0.5:
                    await asyncio.sleep(0)
                    victim.cancel()
                await asyncio.wait((victim,), timeout=2.0)
            assert all(t.cancelled() for t in tasks)
            await server.wait_connections(at_most=0, timeout=1.0)
            deltas = await asyncio.wait_for(collect(pooled, req_with("ok")), 2.0)
            assert deltas[0].content == "ok"
        finally:
            await pooled.aclose()


# -- request building -------------------------------------------------------------------


async def test_request_body_and_headers(server: LoopbackProvider) -> None:
    client = make_client(
        server,
        headers={"X-Team": "agw"},
        extra_body={"seed": 7, "chat_template_kwargs": {"x": 1}},
        reasoning_style="chat_template_kwargs",
    )
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    server.enqueue([finish("stop"), DONE], [finish("stop"), DONE])
    try:
        await collect(client, req(tools=tools, tool_choice="required", temperature=0.3, top_p=0.9))
        await collect(client, req(tool_choice="none", max_tokens=50, run_id="r1", stage="plan"))
    finally:
        await client.aclose()
    first, second = server.requests
    assert first["model"] == "m" and first["stream"] is True
    assert first["stream_options"] == {"include_usage": True}
    assert first["messages"] == [{"role": "user", "content": "hi"}]
    assert first["tools"] == tools and first["tool_choice"] == "required"
    assert first["temperature"] == 0.3 and first["top_p"] == 0.9 and "max_tokens" not in first
    assert first["seed"] == 7
    assert first["chat_template_kwargs"] == {"enable_thinking": False, "x": 1}
    assert "tools" not in second and "tool_choice" not in second
    assert second["max_tokens"] == 50 and "temperature" not in second
    assert "run_id" not in second and "stage" not in second
    headers = server.request_headers[0]
    assert headers["authorization"] == f"Bearer {SECRET}"
    assert headers["x-team"] == "agw"
    assert headers["accept"] == "text/event-stream"


@pytest.mark.parametrize(
    ("style", "on", "off"),
    [
        ("reasoning_effort", {"reasoning_effort": "high"}, {}),
        ("enable_thinking", {"enable_thinking": True}, {"enable_thinking": False}),
        (
            "chat_template_kwargs",
            {"chat_template_kwargs": {"enable_thinking": True}},
            {"chat_template_kwargs": {"enable_thinking": False}},
        ),
        ("think", {"think": True}, {"think": False}),
        ("none", {}, {}),
    ],
)
async def test_reasoning_styles(
    server: LoopbackProvider, style: str, on: dict[str, Any], off: dict[str, Any]
) -> None:
    client = make_client(server, reasoning_style=style, api_key=SecretStr(""))
    base = set(client.build_body(req()).keys()) - set(off)
    server.enqueue([finish("stop"), DONE], [finish("stop"), DONE])
    try:
        await collect(client, req(reasoning=Reasoning(enabled=True, effort="HIGH")))
        await collect(client, req(reasoning=Reasoning(enabled=False)))
    finally:
        await client.aclose()
    enabled, disabled = server.requests
    assert {k: v for k, v in enabled.items() if k not in base} == on
    assert {k: v for k, v in disabled.items() if k not in base} == off
    assert "authorization" not in server.request_headers[0]


# -- interaction log --------------------------------------------------------------------


async def test_interaction_log_masks_secrets(
    server: LoopbackProvider, caplog: pytest.LogCaptureFixture
) -> None:
    client = LoggedModel(
        make_client(
            server,
            headers={"X-Api-Key": SECRET},
            extra_body={"api_key": SECRET, "options": {"Password": SECRET, "max_tokens": 9}},
        )
    )
    args = json.dumps({"token": SECRET, "city": "Paris"})
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": args}}]},
    ]
    server.enqueue(
        [
            reasoning("hmm"),
            content("Hi"),
            tool_call(0, id="call_1", name="get_weather"),
            tool_call(0, arguments='{"city"'),
            finish("tool_calls"),
            usage(3, 4),
            DONE,
        ]
    )
    caplog.set_level(logging.DEBUG, logger="agw.llm")
    request = ModelRequest("fake", "m", messages, run_id="run-77", stage="react")
    try:
        await collect(client, request)
    finally:
        await client.aclose()
    text = caplog.text
    assert SECRET not in text
    assert "***" in text and "Paris" in text and '"max_tokens": 9' in text
    lines = [r.getMessage() for r in caplog.records if r.name == "agw.llm"]
    assert all("run_id=run-77" in line and "stage=react" in line for line in lines)
    assert any("llm.request" in line and "/chat/completions" in line for line in lines)
    assert any("reasoning='hmm'" in line for line in lines)
    assert any("content='Hi'" in line for line in lines)
    assert any("name=get_weather args='{\"city\"'" in line for line in lines)
    assert any("finish_reason=tool_calls" in line for line in lines)
    assert any("usage=prompt:3,completion:4" in line for line in lines)
    assert any("llm.end" in line for line in lines)


async def test_interaction_log_switches(
    server: LoopbackProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="agw.llm")
    unmasked = LoggedModel(
        OpenAIChatClient("fake", ProviderOptions(base_url=server.url, api_key=SecretStr(SECRET))),
        mask_sensitive=False,
    )
    off = OpenAIChatClient("fake", ProviderOptions(base_url=server.url))  # no log: not wrapped
    server.enqueue(*[[finish("stop"), DONE]] * 3)
    try:
        await collect(unmasked)
        assert SECRET in caplog.text
        caplog.clear()
        await collect(off)
        assert not [r for r in caplog.records if r.name == "agw.llm"]
        caplog.set_level(logging.INFO, logger="agw.llm")
        await collect(unmasked)  # DEBUG is off: the wrapped client's stream, not logged
        assert not [r for r in caplog.records if r.name == "agw.llm"]
    finally:
        await unmasked.aclose()
        await off.aclose()


# -- loopback server and registry -------------------------------------------------------


async def test_loopback_models_empty_queue_and_404(server: LoopbackProvider) -> None:
    async with httpx.AsyncClient(base_url=server.url) as http:
        models = await http.get("/models")
        assert models.json()["data"][0]["id"] == "loopback"
        empty = await http.post("/chat/completions", json={"model": "m"})
        assert empty.status_code == 500 and "no script queued" in empty.text
        assert (await http.post("/nope", json={})).status_code == 404
        assert (await http.post("/chat/completions", content=b"[1")).status_code == 400
    assert server.requests == [{"model": "m"}]


async def test_loopback_async_responder_and_async_script() -> None:
    async def script(model: str) -> AsyncIterator[Any]:
        for item in (content(model), finish("stop"), DONE):
            await asyncio.sleep(0)
            yield item

    async def respond(body: dict[str, Any]) -> AsyncIterator[Any]:
        await asyncio.sleep(0)
        return script(body["model"])

    async with LoopbackProvider(respond) as server:
        client = make_client(server)
        try:
            assert (await collect(client))[0].content == "m"
        finally:
            await client.aclose()


async def test_registry(server: LoopbackProvider) -> None:
    registry = ProviderRegistry(
        {
            "a": ProviderOptions(base_url=server.url, default_model="ma"),
            "b": ProviderOptions(base_url=server.url),
        },
        log_enabled=False,
        log_mask=False,
    )
    try:
        assert registry.default_key == "a"
        client = registry.get("a")
        assert isinstance(client, OpenAIChatClient)  # the interaction log is off: not wrapped
        assert registry.get("b").key == "b"
        assert registry.default_model("a") == "ma" and registry.default_model("b") == ""
        with pytest.raises(ProviderNotConfigured) as info:
            registry.get("zzz")
        assert "'zzz'" in str(info.value) and "a, b" in str(info.value)
        demo = make_client(server)
        registry.register("demo", demo, default_model="dm")
        assert registry.get("demo") is demo and registry.default_model("demo") == "dm"
    finally:
        await registry.aclose()
    logged = ProviderRegistry({"a": ProviderOptions(base_url=server.url)}, log_mask=False)
    try:
        client = logged.get("a")
        assert isinstance(client, LoggedModel) and not client.mask_sensitive
        assert isinstance(client.wrapped, OpenAIChatClient) and client.key == "a"
        demo = make_client(server)
        logged.register("demo", demo)
        assert isinstance(wrapped := logged.get("demo"), LoggedModel) and wrapped.wrapped is demo
    finally:
        await logged.aclose()
    empty = ProviderRegistry(default_provider="x")
    assert empty.default_key == "x"
    with pytest.raises(ProviderNotConfigured):
        empty.get("")
