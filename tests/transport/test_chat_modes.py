"""Chat records and history of REACT and PLAN_EXECUTE runs (tools, plans, tasks)."""

from __future__ import annotations

from pathlib import Path

from agw.v1 import gateway_pb2 as gw
from google.protobuf import json_format

from service.core.chats.history import snapshot_form
from service.providers.loopback import LoopbackProvider
from service.testing import Harness
from tests.core.modes.test_plan_execute import add_tasks, planner, report
from tests.core.tools.kit import Probe, agent, answer_turn, call_turn, tool_gateway, tools
from tests.transport.test_chats import assert_golden, normalized_jsonl


def comparable(events) -> list[dict]:
    out = []
    for event in events:
        data = json_format.MessageToDict(event)
        for key in ("seq", "timestamp"):
            data.pop(key, None)
        out.append(data)
    return out


async def record(gateway: Harness, key: str, message: str) -> tuple[list, str]:
    events = await gateway.query(key, message)
    await gateway.app.frontdoor.flush()
    chat_id = events[0].chat_id
    text = normalized_jsonl(gateway.app.settings.chats_path / f"{chat_id}.json")
    return events, text


async def assert_replay(gateway: Harness, live: list) -> None:
    reply = await gateway.stub.GetChat(gw.GetChatRequest(chat_id=live[0].chat_id))
    assert comparable(reply.events) == comparable(snapshot_form(live))


async def test_react_run_records_and_replays(tmp_path: Path, provider: LoopbackProvider) -> None:
    react = agent("REACT", toolConfig=tools("echo"), modelConfig={"reasoning": {"enabled": True}})
    provider.enqueue(
        call_turn(("call_1", "echo", '{"text":"one"}'), reasoning="First echo."),
        call_turn(("call_2", "echo", '{"text":"two"}')),
        answer_turn("Echoed ", "twice.", reasoning="Done."),
    )
    async with tool_gateway(tmp_path, provider, {"r": react}, Probe()) as gateway:
        live, text = await record(gateway, "r", "Echo twice")
        assert live[-1].type == "run.complete"
        assert_golden(text, "react.jsonl")
        await assert_replay(gateway, live)


async def test_plan_execute_run_records_and_replays(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        add_tasks("p1", "Echo a", "Echo b"),
        call_turn(("c1", "echo", '{"text":"a"}')),
        report("u1", "task_1", "completed", "a echoed"),
        report("u2", "task_2", "failed", "no b"),
        answer_turn("Summary"),
    )
    async with tool_gateway(tmp_path, provider, {"p": planner(summary=True)}, Probe()) as gateway:
        live, text = await record(gateway, "p", "Echo a and b")
        assert live[-1].type == "run.complete"
        assert_golden(text, "plan_execute.jsonl")
        await assert_replay(gateway, live)
        types = [e.type for e in snapshot_form(live)]
        assert "plan.create" in types and "task.start" in types and "task.fail" in types
