"""Escalation, the query's mode, subagents and skills through the real gRPC transport.

Each run streams over `Query`, is replayed by `GetChat` in snapshot form and by
`Attach` from the run log as it streamed.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from agw.v1 import gateway_pb2 as gw

from service.core.modes.escalation import PLAN_CREATE_TOOL, SWITCHED
from service.providers.loopback import LoopbackProvider
from service.testing import Harness
from tests.core.agents.test_skills import TRIP, write_skill
from tests.core.modes.test_plan_execute import add_tasks, report
from tests.core.tools.kit import (
    Probe,
    agent,
    answer_turn,
    assert_invariants,
    call_turn,
    kinds,
    result_of,
    tool_gateway,
    tools,
)
from tests.transport.test_chat_modes import assert_replay

HEAD = ["request.query", "chat.start", "run.start"]
CALL = ["tool.start", "tool.args", "tool.args", "tool.end", "tool.result"]
ANSWER = ["content.start", "content.delta", "content.end"]
PLANNED = [*CALL[:4], "plan.create", "tool.result"]
REPORTED = ["task.start", "plan.update", *CALL, "task.complete", "plan.update"]
STAGES = {"plan": {"systemPrompt": "Plan it."}, "execute": {"systemPrompt": "Do it."}}
AGENTS = {
    "esc": agent(
        "REACT",
        "Act.",
        toolConfig=tools("echo"),
        react={"systemPrompt": "Act.", "escalate": True},
        planExecute=STAGES,
    ),
    "both": agent("REACT", "Act.", modes=["REACT", "PLAN_EXECUTE"], planExecute=STAGES),
    "boss": agent("REACT", "Delegate.", toolConfig={"agents": ["helper"]}),
    "helper": agent("REACT", "Help.", toolConfig=tools("echo"), description="Echoes."),
    "guide": agent("REACT", "Guide.", skills=["trip-notes"]),
}


async def recorded(gateway: Harness, live: list) -> None:
    """Wait until the run has ended and its chat records are written."""
    await gateway.app.frontdoor.runs[live[0].run_id].ended()
    await gateway.app.frontdoor.flush()


async def attached(gateway: Harness, live: list) -> None:
    """Attach replays the run's log as it streamed, whole and from its middle."""
    for after in (0, len(live) // 2):
        request = gw.AttachRequest(run_id=live[0].run_id, after_seq=after)
        assert [e async for e in gateway.stub.Attach(request)] == live[after:]


async def test_escalation_over_grpc(tmp_path: Path, provider: LoopbackProvider) -> None:
    provider.enqueue(
        call_turn(("e1", PLAN_CREATE_TOOL, '{"reason":"steps"}')),
        add_tasks("p1", "Echo a"),
        report("u1", "task_1", "completed", "a"),
    )
    async with tool_gateway(tmp_path, provider, AGENTS, Probe()) as gateway:
        live = await gateway.query("esc", "Plan and do")
        assert kinds(live) == [*HEAD, *CALL, *PLANNED, *REPORTED, "run.complete"]
        assert_invariants(live)
        assert result_of(live[7]) == SWITCHED
        await recorded(gateway, live)
        await assert_replay(gateway, live)
        await attached(gateway, live)
    planning = provider.requests[1]
    assert [m["role"] for m in planning["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
    ]
    assert planning["tool_choice"] == "required"


async def test_the_query_chooses_the_mode(tmp_path: Path, provider: LoopbackProvider) -> None:
    provider.enqueue(add_tasks("p1", "Note"), report("u1", "task_1", "completed", "noted"))
    async with tool_gateway(tmp_path, provider, AGENTS, Probe()) as gateway:
        live = await gateway.query("both", "Plan", mode=gw.AGENT_MODE_PLAN_EXECUTE)
        assert kinds(live) == [*HEAD, *PLANNED, *REPORTED, "run.complete"]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await gateway.query("both", "Plan", mode=gw.AGENT_MODE_ONESHOT)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "does not run in mode ONESHOT (it allows REACT, PLAN_EXECUTE" in str(
            refused.value.details()
        )
        agents = {a.key: a for a in (await gateway.stub.ListAgents(gw.ListAgentsRequest())).agents}
    assert list(agents["both"].modes) == [gw.AGENT_MODE_REACT, gw.AGENT_MODE_PLAN_EXECUTE]
    assert list(agents["helper"].modes) == [gw.AGENT_MODE_REACT]
    assert len(provider.requests) == 2


async def test_a_subagent_over_grpc(tmp_path: Path, provider: LoopbackProvider) -> None:
    provider.enqueue(
        call_turn(("h1", "helper", '{"task":"Echo x"}')),
        call_turn(("c1", "echo", '{"text":"x"}')),
        answer_turn("x echoed"),
        answer_turn("Done."),
    )
    async with tool_gateway(tmp_path, provider, AGENTS, Probe()) as gateway:
        live = await gateway.query("boss", "Echo x")
        nested = [*CALL, *ANSWER]
        assert kinds(live) == [*HEAD, *CALL[:4], *nested, "tool.result", *ANSWER, "run.complete"]
        assert_invariants(live)
        assert [e.parent_tool_id for e in live] == ["h1" if 7 <= i < 15 else "" for i in range(20)]
        assert (live[15].tool_result.tool_id, result_of(live[15])) == ("h1", "x echoed")
        await recorded(gateway, live)
        await assert_replay(gateway, live)
        await attached(gateway, live)
    helper = provider.requests[1]
    assert helper["messages"][1:] == [{"role": "user", "content": "Echo x"}]


async def test_skills_over_grpc(tmp_path: Path, provider: LoopbackProvider) -> None:
    skills = tmp_path / "skills"
    write_skill(skills, "trip-notes", TRIP)
    provider.enqueue(
        call_turn(("s1", "skill", json.dumps({"name": "trip-notes"}))), answer_turn("Noted.")
    )
    async with tool_gateway(tmp_path, provider, AGENTS, Probe(), skills_dir=skills) as gateway:
        live = await gateway.query("guide", "Plan my trip")
        assert kinds(live) == [*HEAD, *CALL, *ANSWER, "run.complete"]
        assert result_of(live[7]) == "# Trip notes\n\nList the places, then the times."
        await recorded(gateway, live)
        await assert_replay(gateway, live)
    system = provider.requests[0]["messages"][0]["content"]
    assert system.endswith("- trip-notes: Write travel notes; use when the user plans a trip.")
