"""An ended run is freed by reference counting once it is released, not by the garbage collector.

The service raises the collector's thresholds (service/process/gctune.py), so a
reference cycle between a run's parts (its state, its event log, their observers,
its task) would keep every ended run alive until a rare full collection: memory
grows with every run served. These tests run many real runs with the collector
off and count what is still alive once they are released.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agw.v1 import gateway_pb2 as gw

from service.core.run.eventlog import EventLog
from service.core.run.state import RunState
from service.providers.loopback import DONE, LoopbackProvider, content, finish
from service.testing import Harness, oneshot_agent, write_agent
from tests.core.modes.test_plan_execute import add_tasks, planner, report
from tests.core.tools.kit import agent, answer_turn, call_turn, tool_gateway, tools

RUNS = 60


@contextmanager
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def alive(kind: type) -> int:
    return sum(1 for o in gc.get_objects() if type(o) is kind)


async def released(harness: Harness) -> None:
    """Wait until every ended run has been kept and released."""
    frontdoor = harness.app.frontdoor
    async with asyncio.timeout(10):
        while frontdoor.runs or frontdoor.active_runs:  # noqa: ASYNC110 (no event to await)
            await asyncio.sleep(0.01)
        await frontdoor.flush()


async def test_ended_runs_are_freed_without_the_collector(tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    write_agent(agents, "plain", oneshot_agent())
    async with (
        LoopbackProvider() as provider,
        Harness.start(agents, provider, run_retention_s=0) as harness,
    ):
        provider.enqueue([content("warm"), finish("stop"), DONE])
        await harness.query("plain", "warm up")
        await released(harness)
        with collector_off():
            before = alive(RunState), alive(EventLog)
            for n in range(RUNS):
                provider.enqueue([content(f"answer {n}"), finish("stop"), DONE])
                events = await harness.query("plain", f"question {n}")
                assert events[-1].type == "run.complete"
            await released(harness)
            after = alive(RunState), alive(EventLog)
    assert after[0] - before[0] <= 1 and after[1] - before[1] <= 1, (before, after)


async def test_runs_with_tools_waits_and_cancels_are_freed_too(tmp_path: Path) -> None:
    """Backend and frontend tool calls (a wait answered by Submit), and cancelled runs."""
    tooled = agent(toolConfig=tools("echo", frontends=("pick",)))
    async with (
        LoopbackProvider() as provider,
        tool_gateway(tmp_path, provider, {"tooled": tooled}, run_retention_s=0) as harness,
    ):
        with collector_off():
            before = alive(RunState), alive(EventLog)
            for n in range(RUNS // 3):
                provider.enqueue(
                    call_turn(("c1", "echo", '{"text": "hi"}'), ("c2", "pick", "{}")),
                    answer_turn(f"done {n}"),
                )
                stream = harness.stub.Query(gw.QueryRequest(agent_key="tooled", message="go"))
                async for event in stream:
                    if event.type == "tool.end" and event.tool_end.tool_id.startswith("t_"):
                        answer = gw.SubmitRequest(
                            run_id=event.run_id, tool_id=event.tool_end.tool_id
                        )
                        answer.payload.string_value = "a"
                        assert (await harness.stub.Submit(answer)).accepted
                assert event.type == "run.complete"
                provider.enqueue(call_turn(("c3", "pick", "{}")))
                stream = harness.stub.Query(gw.QueryRequest(agent_key="tooled", message="wait"))
                async for event in stream:
                    if event.type == "tool.end":
                        await harness.stub.Cancel(gw.CancelRequest(run_id=event.run_id))
                assert event.type == "run.cancel"
            await released(harness)
            after = alive(RunState), alive(EventLog)
    assert after[0] - before[0] <= 1 and after[1] - before[1] <= 1, (before, after)


async def test_plans_and_subagents_are_freed_too(tmp_path: Path) -> None:
    """PLAN_EXECUTE tasks and a subagent's nested run, whose tool refers to the caller's context."""
    boss = agent("REACT", "Delegate.", toolConfig={"backends": ["echo"], "agents": ["helper"]})
    helper = agent("REACT", "Help.", toolConfig=tools("echo"), description="Echoes.")
    agents = {"boss": boss, "helper": helper, "planner": planner()}
    async with (
        LoopbackProvider() as provider,
        tool_gateway(tmp_path, provider, agents, run_retention_s=0) as harness,
    ):
        with collector_off():
            before = alive(RunState), alive(EventLog)
            for n in range(RUNS // 3):
                provider.enqueue(
                    call_turn(("h1", "helper", '{"task": "Echo hi"}')),
                    call_turn(("c1", "echo", '{"text": "hi"}')),
                    answer_turn("Echoed hi."),
                    answer_turn(f"It echoed {n}."),
                )
                assert (await harness.query("boss", "delegate"))[-1].type == "run.complete"
                provider.enqueue(
                    add_tasks("p1", "Echo a"),
                    call_turn(("c2", "echo", '{"text": "a"}')),
                    report("u1", "task_1", "completed", f"a echoed {n}"),
                )
                assert (await harness.query("planner", "plan"))[-1].type == "run.complete"
            await released(harness)
            after = alive(RunState), alive(EventLog)
    assert after[0] - before[0] <= 1 and after[1] - before[1] <= 1, (before, after)
