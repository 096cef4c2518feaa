"""GetChat's `live_run`: the chat's run in progress, its last seq and what it waits for."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from agw.v1 import gateway_pb2 as gw

from service.providers.loopback import LoopbackProvider
from service.testing import Harness
from tests.core.tools.kit import agent, answer_turn, call_turn, kinds, tool_gateway, tools
from tests.transport.test_auth import ALICE, BOB, KEYS
from tests.transport.test_submit_cancel import submit, until

AGENTS = {
    "ui": agent(toolConfig=tools(frontends=("pick",))),
    "asker": agent(toolConfig=tools("ask_user")),
}
PICK = call_turn(("call_f", "pick", '{"options":["a","b"]}'))
ASK = call_turn(("call_q", "ask_user", json.dumps({"question": "Which?", "options": ["x", "y"]})))


async def live_run(gateway: Harness, chat_id: str, metadata: Any = ()) -> gw.LiveRun | None:
    chat = await gateway.stub.GetChat(gw.GetChatRequest(chat_id=chat_id), metadata=metadata)
    return chat.live_run if chat.HasField("live_run") else None


async def waiting(gateway: Harness, chat_id: str, metadata: Any = ()) -> gw.LiveRun:
    """The chat's live run once it waits for something."""
    async with asyncio.timeout(10):
        while True:
            live = await live_run(gateway, chat_id, metadata)
            if live is not None and live.waits:
                return live
            await asyncio.sleep(0.01)


def waits(live: gw.LiveRun) -> list[tuple[str, int, str]]:
    return [(w.tool_id, w.kind, w.tool_name) for w in live.waits]


async def test_a_run_waiting_for_a_frontend_tool_is_live_with_its_wait(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(PICK, answer_turn("a it is"))
    async with tool_gateway(tmp_path, provider, AGENTS) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="ui", message="Choose"))
        events: list[Any] = []
        end = await until(call, "tool.end", events)
        live = await waiting(gateway, end.chat_id)
        assert (live.run_id, live.agent_key, live.last_seq) == (end.run_id, "ui", end.seq)
        tool_id = end.tool_end.tool_id
        assert waits(live) == [(tool_id, gw.WAIT_KIND_FRONTEND_TOOL, "pick")]
        assert (await submit(gateway, end.run_id, tool_id, "a")).accepted
        events += [event async for event in call]
        assert await live_run(gateway, end.chat_id) is None  # ended: nothing live
    assert kinds(events)[-1] == "run.complete"


async def test_a_question_is_a_wait_of_its_kind(tmp_path: Path, provider: LoopbackProvider) -> None:
    provider.enqueue(ASK, answer_turn("y then"))
    async with tool_gateway(tmp_path, provider, AGENTS) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="asker", message="Ask me"))
        events: list[Any] = []
        ask = await until(call, "question.ask", events)
        live = await waiting(gateway, ask.chat_id)
        question_id = ask.question_ask.question_id
        assert waits(live) == [(question_id, gw.WAIT_KIND_QUESTION, "question")]
        assert live.last_seq == ask.seq and live.agent_key == "asker"
        assert (await submit(gateway, ask.run_id, question_id, "y")).accepted
        events += [event async for event in call]
        assert await live_run(gateway, ask.chat_id) is None
    assert kinds(events)[-1] == "run.complete"


async def test_a_live_run_is_shown_to_its_owner_only(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(PICK, answer_turn("a it is"))
    async with tool_gateway(tmp_path, provider, AGENTS, auth_api_keys=KEYS) as gateway:
        request = gw.QueryRequest(agent_key="ui", message="Choose")
        call = gateway.stub.Query(request, metadata=ALICE)
        end = await until(call, "tool.end", [])
        live = await waiting(gateway, end.chat_id, ALICE)
        assert live.run_id == end.run_id
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await gateway.stub.GetChat(gw.GetChatRequest(chat_id=end.chat_id), metadata=BOB)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        submit_request = gw.SubmitRequest(run_id=end.run_id, tool_id=end.tool_end.tool_id)
        submit_request.payload.string_value = "a"
        assert (await gateway.stub.Submit(submit_request, metadata=ALICE)).accepted
        assert [event.type async for event in call][-1] == "run.complete"


async def test_live_run_only_answers_the_live_run_without_the_history(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(answer_turn("first answer"), PICK, answer_turn("a it is"))
    async with tool_gateway(tmp_path, provider, AGENTS, auth_api_keys=KEYS) as gateway:
        hello = gw.QueryRequest(agent_key="ui", message="Hi")
        first = [event async for event in gateway.stub.Query(hello, metadata=ALICE)]
        chat_id = first[0].chat_id
        only = gw.GetChatRequest(chat_id=chat_id, live_run_only=True)
        quiet = await gateway.stub.GetChat(only, metadata=ALICE)
        assert (quiet.chat_id, quiet.chat_name, len(quiet.events)) == (chat_id, "Hi", 0)
        assert not quiet.HasField("live_run") and not quiet.references
        call = gateway.stub.Query(
            gw.QueryRequest(agent_key="ui", chat_id=chat_id, message="Choose"), metadata=ALICE
        )
        end = await until(call, "tool.end", [])
        live = await waiting(gateway, chat_id, ALICE)
        chat = await gateway.stub.GetChat(only, metadata=ALICE)
        assert chat.live_run == live and list(chat.events) == [] and not chat.raw_messages
        full = await gateway.stub.GetChat(gw.GetChatRequest(chat_id=chat_id), metadata=ALICE)
        assert full.live_run == live and kinds(full.events)[:2] == ["request.query", "chat.start"]
        for metadata, chat_wanted in ((BOB, chat_id), (ALICE, "no-such-chat")):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                request = gw.GetChatRequest(chat_id=chat_wanted, live_run_only=True)
                await gateway.stub.GetChat(request, metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        answer = gw.SubmitRequest(run_id=end.run_id, tool_id=end.tool_end.tool_id)
        answer.payload.string_value = "a"
        assert (await gateway.stub.Submit(answer, metadata=ALICE)).accepted
        assert [event.type async for event in call][-1] == "run.complete"
