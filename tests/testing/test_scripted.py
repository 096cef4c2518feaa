"""ScriptedModel: the in-process model port fake plays its turns as a provider streams."""

from __future__ import annotations

import asyncio

import pytest

from service import testing as sm
from service.core.errors import ProviderError
from service.core.model import ModelClient, ModelDelta, ModelRequest, ToolCallDelta, Usage
from service.providers import loopback as lb
from service.testing import ScriptedModel


def request(text: str = "Hi") -> ModelRequest:
    return ModelRequest("scripted", "m", [{"role": "user", "content": text}])


async def play(model: ModelClient, req: ModelRequest | None = None) -> list[ModelDelta]:
    async with model.stream(req or request()) as deltas:
        return [delta async for delta in deltas]


async def test_a_turn_streams_one_delta_per_item_in_order() -> None:
    model = ScriptedModel()
    model.enqueue(
        [
            sm.reasoning("Hm"),
            sm.content("Hel"),
            sm.content("lo"),
            sm.tool_call(0, "c1", "echo", '{"te'),
            sm.tool_call(0, arguments='xt":1}'),
            sm.tool_calls(sm.tool_call_part(1, "c2", "a"), sm.tool_call_part(2, "c3", "b")),
            sm.finish("tool_calls"),
            sm.usage(10, 5, reasoning_tokens=2),
        ]
    )
    assert await play(model) == [
        ModelDelta(reasoning="Hm"),
        ModelDelta(content="Hel"),
        ModelDelta(content="lo"),
        ModelDelta(tool_calls=(ToolCallDelta(0, "c1", "echo", '{"te'),)),
        ModelDelta(tool_calls=(ToolCallDelta(0, None, None, 'xt":1}'),)),
        ModelDelta(tool_calls=(ToolCallDelta(1, "c2", "a"), ToolCallDelta(2, "c3", "b"))),
        ModelDelta(finish_reason="tool_calls"),
        ModelDelta(usage=Usage(10, 5, 15, reasoning_tokens=2)),
    ]
    [call] = model.calls
    assert (call.deltas, call.finished, call.closed) == (8, True, True)


async def test_loopback_chunks_give_the_same_deltas_as_the_builders() -> None:
    model = ScriptedModel()
    model.enqueue(
        [
            lb.reasoning("Hm"),
            lb.content("Hi"),
            lb.tool_call(0, "c1", "echo", "{}"),
            lb.finish("stop"),
            lb.usage(3, 2, reasoning_tokens=1),
            lb.DONE,
            lb.content("never sent"),
        ],
        [
            sm.reasoning("Hm"),
            sm.content("Hi"),
            sm.tool_call(0, "c1", "echo", "{}"),
            sm.finish("stop"),
            sm.usage(3, 2, reasoning_tokens=1),
        ],
    )
    from_chunks, from_builders = await play(model), await play(model)
    assert from_chunks == from_builders
    assert model.pending == 0


async def test_every_request_is_recorded_as_received() -> None:
    model = ScriptedModel()
    model.enqueue([sm.content("a")], [sm.content("b")])
    first, second = request("one"), request("two")
    second.tools = [{"type": "function", "function": {"name": "echo"}}]
    second.tool_choice = "required"
    await play(model, first)
    await play(model, second)
    assert model.requests == [first, second]
    assert model.requests[1].tool_choice == "required"


async def test_a_stream_error_is_raised_where_it_stands() -> None:
    model = ScriptedModel("up")
    model.enqueue([sm.content("Part"), sm.fail("overloaded"), sm.content("never")])
    received: list[ModelDelta] = []
    with pytest.raises(ProviderError) as raised:
        async with model.stream(request()) as deltas:
            async for delta in deltas:
                received.append(delta)
    assert received == [ModelDelta(content="Part")]
    assert (raised.value.reason, raised.value.message) == (
        "PROVIDER_STREAM_ERROR",
        "provider 'up': stream error: overloaded",
    )
    [call] = model.calls
    assert (call.deltas, call.finished, call.closed) == (1, False, True)


async def test_the_loopback_error_chunk_fails_the_same_way() -> None:
    model = ScriptedModel("up")
    model.enqueue([lb.error_chunk("overloaded")], [sm.fail("overloaded")])
    errors = []
    for _ in range(2):
        with pytest.raises(ProviderError) as raised:
            await play(model)
        errors.append((raised.value.reason, raised.value.message))
    assert (
        errors[0]
        == errors[1]
        == ("PROVIDER_STREAM_ERROR", "provider 'up': stream error: overloaded")
    )


async def test_any_exception_in_a_turn_is_raised_as_it_is() -> None:
    model = ScriptedModel()
    model.enqueue([sm.content("a"), TimeoutError("read timed out")])
    with pytest.raises(TimeoutError, match="read timed out"):
        await play(model)


async def test_without_a_queued_turn_the_call_fails_before_any_delta() -> None:
    model = ScriptedModel("empty")
    with pytest.raises(ProviderError, match="no turn queued") as raised:
        async with model.stream(request()):
            pytest.fail("the block must not run")
    assert raised.value.status == 500
    assert model.calls[0].closed


async def test_cancelling_the_caller_at_a_gate_closes_the_stream() -> None:
    model = ScriptedModel()
    gate = asyncio.Event()
    model.enqueue([sm.content("one"), lb.Gate(gate), sm.content("two"), sm.finish("stop")])
    received: list[ModelDelta] = []
    first = asyncio.Event()

    async def consume() -> None:
        async with model.stream(request()) as deltas:
            async for delta in deltas:
                received.append(delta)
                first.set()

    task = asyncio.create_task(consume())
    await first.wait()
    await asyncio.sleep(0)  # the consumer is back in the stream, waiting at the gate
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert received == [ModelDelta(content="one")]
    [call] = model.calls
    assert (call.deltas, call.finished, call.closed) == (1, False, True)


async def test_leaving_the_block_early_closes_the_stream() -> None:
    model = ScriptedModel()
    model.enqueue([sm.content("one"), lb.Pause(0.001), sm.content("two"), sm.finish("stop")])
    async with model.stream(request()) as deltas:
        async for _ in deltas:
            break
    [call] = model.calls
    assert (call.deltas, call.finished, call.closed) == (1, False, True)
    await model.aclose()
    assert model.client_closed


def test_it_is_a_model_client() -> None:
    client: ModelClient = ScriptedModel("k")
    assert client.key == "k"


async def test_a_turn_item_of_another_kind_is_refused() -> None:
    model = ScriptedModel()
    model.enqueue([b"data: raw sse\n\n"])
    with pytest.raises(TypeError, match="not an item of a scripted turn"):
        await play(model)
