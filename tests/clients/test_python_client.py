"""The Python client (async and sync) against the real service in-process, on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from agw.v1 import gateway_pb2 as gw
from agw_client import (
    AsyncClient,
    Client,
    InvalidArgument,
    NotFound,
    RunCancelled,
    RunFailed,
    event_to_dict,
    fold_runs,
)
from google.protobuf import json_format

from service.providers.loopback import (
    DONE,
    Gate,
    HttpError,
    LoopbackProvider,
    ScriptItem,
    content,
    finish,
    reasoning,
    tool_call,
    usage,
)
from service.testing import Harness
from tests.core.tools.kit import Probe, agent, answer_turn, call_turn, tool_gateway, tools

ANSWER: list[ScriptItem] = [content("Hel"), content("lo"), finish("stop"), DONE]


def target(gateway: Harness) -> str:
    return f"127.0.0.1:{gateway.app.grpc.port}"


async def test_query_yields_typed_events(gateway: Harness, provider: LoopbackProvider) -> None:
    provider.enqueue([reasoning("Hm."), *ANSWER])
    async with AsyncClient(target(gateway)) as agw, agw.query("thinker", "Hi") as stream:
        events = [event async for event in stream]
    assert [e.type for e in events] == [
        "request.query",
        "chat.start",
        "run.start",
        "reasoning.start",
        "reasoning.delta",
        "reasoning.end",
        "content.start",
        "content.delta",
        "content.delta",
        "content.end",
        "run.complete",
    ]
    assert [e.seq for e in events] == list(range(1, 12))
    assert events[7].content_delta.delta == "Hel"
    assert (stream.run_id, stream.chat_id) == (events[0].run_id, events[0].chat_id)
    assert stream.last_seq == 11
    result = stream.folder.result
    assert (result.answer, result.reasoning, result.outcome) == ("Hello", "Hm.", "complete")


async def test_ask_folds_the_answer_and_passes_request_fields(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(ANSWER, ANSWER)
    async with AsyncClient(target(gateway)) as agw:
        first = await agw.ask("plain", "Hi", params={"lang": "en"}, request_id="r-1")
        second = await agw.ask("plain", "Again", chat_id=first.chat_id)
    assert (first.answer, first.finish_reason) == ("Hello", "stop")
    assert second.chat_id == first.chat_id and second.run_id != first.run_id
    assert provider.requests[1]["messages"][-1] == {"role": "user", "content": "Again"}


async def test_usage_and_tool_calls_are_folded(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue([tool_call(0, "call_1", "lookup", '{"q": 1}'), finish("tool_calls"), DONE])
    async with AsyncClient(target(gateway)) as agw:
        stream = agw.query("plain", "look it up")
        result = await stream.result()
    assert [(c.tool_id, c.name, c.args) for c in result.tool_calls] == [
        ("call_1", "lookup", {"q": 1})
    ]
    provider.enqueue([content("x"), finish("stop"), usage(5, 2), DONE])
    async with AsyncClient(target(gateway)) as agw:
        result = await agw.ask("plain", "usage?")
    assert result.usage is not None and result.usage.total_tokens == 7


async def test_run_error_raises_run_failed(gateway: Harness, provider: LoopbackProvider) -> None:
    provider.enqueue([HttpError(500, {"error": {"message": "boom"}})])
    async with AsyncClient(target(gateway)) as agw:
        with pytest.raises(RunFailed) as caught:
            await agw.ask("plain", "Hi")
    assert caught.value.reason == "PROVIDER_ERROR"
    assert caught.value.metadata["status"] == "500"
    assert caught.value.run_id


async def test_statuses_become_typed_errors_with_reason(gateway: Harness) -> None:
    async with AsyncClient(target(gateway)) as agw:
        with pytest.raises(NotFound) as caught:
            await agw.ask("nope", "Hi")
        assert caught.value.reason == "AGENT_NOT_FOUND" and caught.value.domain == "agw.v1"
        assert "nope" in caught.value.message
        assert str(caught.value).startswith("NOT_FOUND: ")
        with pytest.raises(InvalidArgument):
            await agw.get_agent("")
        with pytest.raises(NotFound):
            await agw.cancel("no-such-run")


async def test_cancel_from_the_stream_ends_with_run_cancel(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue([content("so far"), Gate(gate), content("never"), finish("stop"), DONE])
    async with AsyncClient(target(gateway)) as agw:
        stream = agw.query("plain", "go")
        async for event in stream:
            if event.type == "content.delta":
                assert (await stream.cancel()).cancelled
        result = stream.folder.result
        outcome = (result.outcome, result.cancel_reason, result.answer)
        assert outcome == ("cancel", "cancel", "so far")
        with pytest.raises(RunCancelled):
            result.raise_for_outcome()


async def test_attach_replays_after_seq_then_follows(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue([content("a"), Gate(gate), content("b"), finish("stop"), DONE])
    async with AsyncClient(target(gateway)) as agw:
        stream = agw.query("plain", "go")
        async for event in stream:
            if event.type == "content.delta":
                break
        rejoined = agw.attach(stream.run_id, after_seq=4)
        gate.set()
        events = [event async for event in rejoined]
        stream.close()
    assert [(e.seq, e.type) for e in events] == [
        (5, "content.delta"),
        (6, "content.delta"),
        (7, "content.end"),
        (8, "run.complete"),
    ]
    assert rejoined.folder.result.outcome == "complete"


async def test_agents_are_listed_and_described(gateway: Harness) -> None:
    async with AsyncClient(target(gateway)) as agw:
        agents = await agw.list_agents()
        thinker = await agw.get_agent("thinker")
    assert [(a.key, a.mode) for a in agents] == [
        ("plain", gw.AGENT_MODE_ONESHOT),
        ("thinker", gw.AGENT_MODE_ONESHOT),
    ]
    assert thinker.agent.key == "thinker"
    definition = json_format.MessageToDict(thinker.definition)
    assert definition["plain"]["systemPrompt"] == "Think first."


async def test_chats_are_listed_and_read_back(gateway: Harness, provider: LoopbackProvider) -> None:
    provider.enqueue(ANSWER, ANSWER)
    async with AsyncClient(target(gateway)) as agw:
        first = await agw.ask("plain", "First chat")
        second = await agw.ask("plain", "Second chat")
        page = await agw.list_chats(page_size=1)
        everything = [chat.chat_id async for chat in agw.iter_chats(page_size=1)]
        history = await agw.get_chat(first.chat_id)
        name_only = await agw.get_chat(first.chat_id, live_run_only=True)
    assert (name_only.chat_name, list(name_only.events)) == ("First chat", [])
    assert not name_only.HasField("live_run")
    assert [c.chat_id for c in page.chats] == [second.chat_id]
    assert everything == [second.chat_id, first.chat_id]
    assert history.chat_name == "First chat"
    from agw_client import fold_runs

    (run,) = fold_runs(history.events)
    assert (run.run_id, run.answer, run.outcome) == (first.run_id, "Hello", "complete")


async def test_sync_client_does_the_same(gateway: Harness, provider: LoopbackProvider) -> None:
    provider.enqueue(ANSWER, ANSWER)

    def use_sync_client() -> tuple[list[str], str, list[str]]:
        with Client(target(gateway)) as agw:
            with agw.query("plain", "Hi") as stream:
                kinds = [event.type for event in stream]
            answer = agw.ask("plain", "Hi").answer
            keys = [a.key for a in agw.list_agents()]
            try:
                agw.ask("nope", "Hi")
            except NotFound as error:
                assert error.reason == "AGENT_NOT_FOUND"
            else:
                raise AssertionError("NotFound expected")
        return kinds, answer, keys

    kinds, answer, keys = await asyncio.to_thread(use_sync_client)
    assert kinds[-4:] == ["content.delta", "content.delta", "content.end", "run.complete"]
    assert answer == "Hello"
    assert keys == ["plain", "thinker"]


async def test_events_as_flat_json(gateway: Harness, provider: LoopbackProvider) -> None:
    provider.enqueue([content("Hi"), finish("stop"), usage(3, 1), DONE])
    async with AsyncClient(target(gateway)) as agw:
        events = [e async for e in agw.query("plain", "x")]
    delta = event_to_dict(events[4])
    assert delta == {
        "seq": 5,
        "type": "content.delta",
        "timestamp": events[4].timestamp,
        "chatId": events[4].chat_id,
        "runId": events[4].run_id,
        "contentId": f"{events[4].run_id}_c_1",
        "delta": "Hi",
    }
    done = event_to_dict(events[-1])
    assert done["finishReason"] == "stop"
    assert done["usage"]["promptTokens"] == 3  # int64 fields are numbers, not strings


async def test_submit_answers_a_waiting_frontend_tool(
    frontend_gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        [tool_call(0, "call_1", "pick", '{"question": "Color?"}'), finish("tool_calls"), DONE],
        [content("Blue it is"), finish("stop"), DONE],
    )
    replies = []
    async with AsyncClient(target(frontend_gateway)) as agw:
        stream = agw.query("picker", "Pick a color")
        async for event in stream:
            if event.type == "tool.end":
                tool_id = event.tool_end.tool_id
                replies.append(
                    await agw.submit(
                        stream.run_id, tool_id, {"color": "blue"}, chat_id=stream.chat_id
                    )
                )
                replies.append(await agw.submit(stream.run_id, tool_id, "red"))
        replies.append(await agw.submit("no-such-run", "t_00000000", 1))
    assert [(r.accepted, r.outcome) for r in replies] == [
        (True, gw.SUBMIT_OUTCOME_ACCEPTED),
        (False, gw.SUBMIT_OUTCOME_ALREADY_ANSWERED),
        (False, gw.SUBMIT_OUTCOME_UNKNOWN_RUN),
    ]
    result = stream.folder.result
    (call,) = result.tool_calls
    assert call.tool_id.startswith("t_") and (call.name, call.type) == ("pick", "html")
    assert (call.args, call.result, call.done) == ({"question": "Color?"}, {"color": "blue"}, True)
    assert (result.answer, result.outcome) == ("Blue it is", "complete")


async def test_upload_returns_a_reference_for_a_later_query(gateway: Harness) -> None:
    async with AsyncClient(target(gateway)) as agw:
        stored = await agw.upload("notes.txt", b"hello", mime_type="text/plain")
    assert stored.reference.id and stored.reference.name == "notes.txt"
    assert stored.reference.size_bytes == 5
    assert stored.event.type == "request.upload"
    assert stored.event.request_upload.reference_id == stored.reference.id


async def test_a_subagents_run_folds_into_its_call(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = {
        "boss": agent("REACT", "Delegate.", toolConfig={"agents": ["helper"]}),
        "helper": agent("REACT", "Help.", toolConfig=tools("echo")),
    }
    provider.enqueue(
        call_turn(("h1", "helper", '{"task":"Echo x"}')),
        call_turn(("c1", "echo", '{"text":"x"}')),
        answer_turn("x echoed"),
        answer_turn("Done."),
    )
    async with (
        tool_gateway(tmp_path, provider, agents, Probe()) as gateway,
        AsyncClient(target(gateway)) as agw,
    ):
        result = await agw.ask("boss", "Echo x")
        await gateway.app.frontdoor.runs[result.run_id].ended()
        await gateway.app.frontdoor.flush()  # the chat is written
        history = fold_runs((await agw.get_chat(result.chat_id)).events)
    for folded in (result, *history):
        assert (folded.answer, folded.contents) == ("Done.", ["Done."])
        [call] = folded.tool_calls
        assert (call.name, call.result) == ("helper", "x echoed")
        assert call.nested is not None and call.nested.answer == "x echoed"
        assert [(c.name, c.result) for c in call.nested.tool_calls] == [
            ("echo", {"echo": "x", "taskId": ""})
        ]
