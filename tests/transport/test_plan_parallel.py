"""Parallel plan tasks through gRPC: the interleaved stream, Attach at every seq, GetChat, records.

The provider answers each task from that task's own script (found by the task id
its brief names), and gates make the tasks interleave at fixed points, so the
stream, its history and the chat file are exact.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from pathlib import Path
from typing import Any

from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw

from service.core.chats.history import snapshot_form
from service.providers import loopback as lb
from service.providers.loopback import LoopbackProvider
from tests.core.tools.kit import (
    Probe,
    agent,
    answer_turn,
    assert_invariants,
    call_turn,
    kinds,
    tool_gateway,
    tools,
)
from tests.transport.test_chat_modes import comparable
from tests.transport.test_chats import assert_golden, attach, chat_file, normalized_jsonl

TASK_ID = re.compile(r"Current task id: (task_\d+)")
CALL = ["tool.start", "tool.args", "tool.args", "tool.end", "tool.result"]


def report(call_id: str, task_id: str, result: str) -> list[lb.ScriptItem]:
    text = f'{{"taskId": "{task_id}", "status": "completed", "result": "{result}"}}'
    return call_turn((call_id, "_plan_update_task_", text))


def gate() -> lb.Gate:
    return lb.Gate(asyncio.Event())


class ByTask:
    """A responder: each task's requests get that task's scripts, the others the run's."""

    def __init__(self, scripts: dict[str, list[list[lb.ScriptItem]]]) -> None:
        self.scripts = {task: deque(turns) for task, turns in scripts.items()}

    def __call__(self, body: dict[str, Any]) -> list[lb.ScriptItem]:
        brief = str(body["messages"][1]["content"])
        found = TASK_ID.search(brief)
        return self.scripts[found.group(1) if found else ""].popleft()


async def test_interleaved_tasks_stream_attach_and_replay_exactly(tmp_path: Path) -> None:
    a_thought, b_thought, a_done = gate(), gate(), gate()
    releases = {
        ("reasoning.delta", "task_1"): a_thought,  # task_2 starts once task_1 has thought
        ("reasoning.delta", "task_2"): b_thought,  # then task_1 goes on
        ("task.complete", "task_1"): a_done,  # and task_2 once task_1 is done
    }
    plan = '{"tasks": [{"description": "Echo a"}, {"description": "Echo b"}, ' + (
        '{"description": "Join", "dependsOn": [1, 2]}]}'
    )
    responder = ByTask(
        {
            "": [call_turn(("p1", "_plan_add_tasks_", plan)), answer_turn("a and b")],
            "task_1": [
                [lb.reasoning("A"), b_thought, *call_turn(("c1", "echo", '{"text":"a"}'))],
                report("u1", "task_1", "a"),
            ],
            "task_2": [
                [a_thought, lb.reasoning("B"), a_done, *call_turn(("c2", "echo", '{"text":"b"}'))],
                report("u2", "task_2", "b"),
            ],
            "task_3": [report("u3", "task_3", "a+b")],
        }
    )
    definition = agent(
        "PLAN_EXECUTE",
        toolConfig=tools("echo"),
        modelConfig={"reasoning": {"enabled": True}},
        planExecute={
            "execute": {"systemPrompt": "Do it.", "parallel": 2},
            "summary": {"systemPrompt": "Sum up.", "toolConfig": None},
        },
    )
    async with (
        LoopbackProvider(responder) as provider,
        tool_gateway(tmp_path, provider, {"p": definition}, Probe()) as gateway,
    ):
        call = gateway.stub.Query(gw.QueryRequest(agent_key="p", message="Echo a and b, join"))
        live: list = []
        followers: list[asyncio.Task] = []
        async for event in call:
            live.append(event)
            followers.append(asyncio.create_task(attach(gateway, event.run_id, event.seq)))
            released = releases.pop((event.type, event.task_id), None)
            if released is not None:
                released.event.set()
        for follower, event in zip(followers, live, strict=True):  # joined while live
            assert await follower == live[event.seq :]
        for after in range(len(live) + 1):  # and once ended
            assert await attach(gateway, live[0].run_id, after) == live[after:]
        await gateway.app.frontdoor.flush()
        reply = await gateway.stub.GetChat(gw.GetChatRequest(chat_id=live[0].chat_id))
        assert comparable(reply.events) == comparable(snapshot_form(live))
        assert_golden(normalized_jsonl(chat_file(gateway, live[0].chat_id)), "plan_parallel.jsonl")

    assert kinds(live) == [
        "request.query",
        "chat.start",
        "run.start",
        *CALL[:4],
        "plan.create",
        "tool.result",
        "task.start",
        "plan.update",
        "task.start",
        "plan.update",
        "reasoning.start",  # task_1
        "reasoning.delta",
        "reasoning.start",  # task_2
        "reasoning.delta",
        "reasoning.end",  # task_1 from here
        *CALL,
        *CALL,
        "task.complete",
        "plan.update",
        "reasoning.end",  # task_2 from here
        *CALL,
        *CALL,
        "task.complete",
        "plan.update",
        "task.start",
        "plan.update",
        *CALL,
        "task.complete",
        "plan.update",
        "content.start",
        "content.delta",
        "content.end",
        "run.complete",
    ]
    assert [e.task_id for e in live[13:17]] == ["task_1", "task_1", "task_2", "task_2"]
    assert_invariants(live)
    assert not releases


async def test_a_cancelled_plan_ends_its_running_task_canceled(tmp_path: Path) -> None:
    never = gate()
    plan = '{"tasks": [{"description": "Echo a"}, {"description": "Echo b"}]}'
    responder = ByTask(
        {
            "": [call_turn(("p1", "_plan_add_tasks_", plan))],
            "task_1": [[lb.content("Working"), never, *answer_turn("never sent")]],
        }
    )
    definition = agent("PLAN_EXECUTE", toolConfig=tools("echo"))
    async with (
        LoopbackProvider(responder) as provider,
        tool_gateway(tmp_path, provider, {"p": definition}, Probe()) as gateway,
    ):
        call = gateway.stub.Query(gw.QueryRequest(agent_key="p", message="Echo a, then b"))
        live: list = []
        async for event in call:
            live.append(event)
            if event.type == "content.delta":
                reply = await gateway.stub.Cancel(gw.CancelRequest(run_id=event.run_id))
                assert reply.cancelled
        await gateway.app.frontdoor.flush()
        history = await gateway.stub.GetChat(gw.GetChatRequest(chat_id=live[0].chat_id))

    assert kinds(live) == [
        "request.query",
        "chat.start",
        "run.start",
        *CALL[:4],
        "plan.create",
        "tool.result",
        "task.start",
        "plan.update",
        "content.start",
        "content.delta",
        "plan.update",  # the running task ends canceled, and the plan says so
        "content.end",  # its open block is closed when the run ends
        "run.cancel",
    ]
    assert [e.task_id for e in live[-5:]] == ["task_1"] * 4 + [""]
    final = [(t.task_id, t.status) for t in live[-3].plan_update.plan.tasks]
    assert final == [("task_1", pb.TASK_STATUS_CANCELED), ("task_2", pb.TASK_STATUS_INIT)]
    assert live[-1].run_cancel.reason == "cancel"
    assert comparable(history.events) == comparable(snapshot_form(live))
    assert_invariants(live)
