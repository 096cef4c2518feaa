"""The replanner and the verifier through gRPC: exact streams, Attach at every seq, GetChat."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw

from service.core.chats.history import snapshot_form
from service.providers.loopback import LoopbackProvider
from service.testing import Harness
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
from tests.transport.test_chats import attach

HEAD = ["request.query", "chat.start", "run.start"]
CALL = ["tool.start", "tool.args", "tool.args", "tool.end", "tool.result"]
ANNOUNCED = ["tool.start", "tool.args", "tool.args", "tool.end"]  # then plan.*, tool.result
TASK = ["task.start", "plan.update", *CALL, "task.complete", "plan.update"]
ANSWERED = ["content.start", "content.delta", "content.end", "run.complete"]


def plan(call_id: str, *descriptions: str) -> list:
    tasks = ", ".join(f'{{"description": "{d}"}}' for d in descriptions)
    return call_turn((call_id, "_plan_add_tasks_", f'{{"tasks": [{tasks}]}}'))


def report(call_id: str, task_id: str, result: str) -> list:
    text = f'{{"taskId": "{task_id}", "status": "completed", "result": "{result}"}}'
    return call_turn((call_id, "_plan_update_task_", text))


def planner(**stages: Any) -> dict[str, Any]:
    return agent(
        "PLAN_EXECUTE",
        toolConfig=tools("echo"),
        planExecute={"summary": {"systemPrompt": "Sum up.", "toolConfig": None}, **stages},
    )


async def run_and_replay(gateway: Harness, key: str, message: str) -> list:
    """Run a query; Attach from every seq and GetChat give back what streamed."""
    live = await gateway.query(key, message)
    for after in range(len(live) + 1):
        assert await attach(gateway, live[0].run_id, after) == live[after:]
    await gateway.app.frontdoor.flush()
    reply = await gateway.stub.GetChat(gw.GetChatRequest(chat_id=live[0].chat_id))
    assert comparable(reply.events) == comparable(snapshot_form(live))
    assert_invariants(live)
    return live


async def test_the_replanner_revises_then_finishes(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        plan("p1", "Find a", "Find b"),
        report("u1", "task_1", "a"),
        call_turn(
            (
                "d1",
                "_plan_decide_",
                '{"decision": "revise", "reason": "b is not needed", '
                '"tasks": [{"description": "Check a"}, {"description": "Note a"}]}',
            )
        ),
        report("u3", "task_3", "a checked"),
        call_turn(("d2", "_plan_decide_", '{"decision": "finish", "reason": "enough"}')),
        answer_turn("It is a."),
    )
    agents = {"p": planner(replan={"systemPrompt": "Review."})}
    async with tool_gateway(tmp_path, provider, agents, Probe()) as gateway:
        live = await run_and_replay(gateway, "p", "Find a and b")
    assert kinds(live) == [
        *HEAD,
        *ANNOUNCED,
        "plan.create",
        "tool.result",
        *TASK,
        *ANNOUNCED,
        "plan.revise",
        "tool.result",
        *TASK,
        *ANNOUNCED,
        "plan.revise",
        "tool.result",
        *ANSWERED,
    ]
    revised = [e.plan_revise for e in live if e.type == "plan.revise"]
    assert [(r.decision, r.reason) for r in revised] == [
        (pb.PLAN_DECISION_REVISE, "b is not needed"),
        (pb.PLAN_DECISION_FINISH, "enough"),
    ]
    assert [(t.task_id, t.status) for t in revised[-1].plan.tasks] == [
        ("task_1", pb.TASK_STATUS_COMPLETED),
        ("task_2", pb.TASK_STATUS_CANCELED),
        ("task_3", pb.TASK_STATUS_COMPLETED),
        ("task_4", pb.TASK_STATUS_CANCELED),
    ]
    assert [b["tool_choice"] for b in provider.requests[2::2][:2]] == ["required", "required"]


async def test_the_verifier_sends_the_planner_back_once(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        plan("p1", "Find a"),
        report("u1", "task_1", "a"),
        call_turn(
            (
                "v1",
                "_plan_verify_",
                '{"verdict": "needsMorePlanning", "improvements": ["find b too"]}',
            )
        ),
        plan("p2", "Find b"),
        report("u2", "task_2", "b"),
        call_turn(("v2", "_plan_verify_", '{"verdict": "pass"}')),
        answer_turn("a and b."),
    )
    agents = {"p": planner(verify={"systemPrompt": "Check."})}
    async with tool_gateway(tmp_path, provider, agents, Probe()) as gateway:
        live = await run_and_replay(gateway, "p", "Find a and b")
    assert kinds(live) == [
        *HEAD,
        *ANNOUNCED,
        "plan.create",
        "tool.result",
        *TASK,
        *CALL,  # the verdict: needsMorePlanning
        *ANNOUNCED,  # the second planning round
        "plan.revise",
        "tool.result",
        *TASK,
        *CALL,  # the verdict: pass
        *ANSWERED,
    ]
    revise = next(e.plan_revise for e in live if e.type == "plan.revise")
    assert (revise.decision, revise.reason) == (pb.PLAN_DECISION_REVISE, "find b too")
    assert revise.plan_id == next(e.plan_create.plan_id for e in live if e.type == "plan.create")
