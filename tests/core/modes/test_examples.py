"""Every shipped example agent runs end to end on the built-in demo model, with its tools."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agw.v1 import gateway_pb2 as gw
from google.protobuf import struct_pb2

from service.testing import Harness
from tests.core.tools.kit import assert_invariants, kinds

ROOT = Path(__file__).resolve().parents[3]
EXPECTED = {
    "demo_oneshot": {"reasoning.start", "content.start"},
    "demo_plain": {"content.start"},
    "demo_react": {"tool.result", "reasoning.start"},
    "demo_plan": {"plan.create", "task.start", "task.complete", "plan.update", "tool.result"},
    "demo_frontend": {"request.submit", "tool.result"},
    "demo_action": {"action.param", "action.result"},
}


@pytest.fixture
async def demo(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness.start(
        ROOT / "agents",
        None,
        tools_dir=ROOT / "tools",
        demo_delay_ms=0,
        data_dir=tmp_path,
        http_enabled=False,
    ) as harness:
        yield harness


async def test_the_examples_cover_every_mode_and_tool_kind(demo: Harness) -> None:
    agents = demo.app.agents.list()
    assert {a.mode for a in agents} == {"ONESHOT", "REACT", "PLAN_EXECUTE"}
    kinds_used = set()
    for agent in agents:
        for stage in agent.stage_names:
            for tool in demo.app.tools.for_stage(agent.stage(stage), agent.tool_policy).ordinary:
                kinds_used.add(tool.kind)
    assert kinds_used == {"backend", "frontend", "action"}
    assert demo.app.tools.errors == {} and demo.app.agents.errors == {}


@pytest.mark.parametrize("key", sorted(EXPECTED))
async def test_an_example_agent_runs_on_the_demo_model(demo: Harness, key: str) -> None:
    call = demo.stub.Query(gw.QueryRequest(agent_key=key, message="Weather in Paris tomorrow?"))
    events = []
    async for event in call:
        events.append(event)
        if event.type == "tool.end" and event.tool_end.tool_id.startswith("t_"):
            reply = await demo.stub.Submit(
                gw.SubmitRequest(
                    run_id=event.run_id,
                    tool_id=event.tool_end.tool_id,
                    payload=struct_pb2.Value(string_value="Yes"),
                )
            )
            assert reply.accepted
    assert events[-1].type == "run.complete", events[-1]
    assert_invariants(events)
    assert EXPECTED[key] <= set(kinds(events))
    errors = [e for e in events if e.type == "tool.result" and e.tool_result.error]
    assert errors == []
