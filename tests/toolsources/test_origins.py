"""Tool origins in the core: `toolConfig.mcp` selection, redescription, `source.snapshot` scope.

An in-memory source stands in for an MCP server here (the real one is in
test_mcp_query.py): it knows its origin even while it offers no tool.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from service.core.agents.loader import AgentDefinitionError, parse_agent_text
from service.core.errors import ToolNotFound
from service.core.tools.definitions import ToolDefinition, ToolOrigin
from service.core.tools.registry import ToolRegistry
from service.core.tools.sources import OriginSource, ToolCallInfo, ToolHandler
from service.providers.loopback import LoopbackProvider
from tests.core.modes.test_plan_execute import add_tasks, report
from tests.core.tools.kit import (
    agent,
    answer_turn,
    assert_invariants,
    call_turn,
    kinds,
    result_of,
    tool_gateway,
    tools,
)
from tests.toolsources.kit import ANSWER, CALL, HEAD, snapshots

CLOCK = ToolOrigin("mcp:clock", "Clock", "", "emoji:⏰")


class Server:
    """An MCP-server-like source: tools of one origin, which may come and go."""

    executes = True

    def __init__(self, origin: ToolOrigin = CLOCK, *names: str) -> None:
        self.name = f"MCP server '{origin.title}'"
        self.origin = origin
        self.version = 0
        self.errors: Mapping[str, str] = {}
        self.names: list[str] = list(names)

    @property
    def origins(self) -> Sequence[ToolOrigin]:
        return (self.origin,)

    def offer(self, *names: str) -> None:
        self.names = list(names)
        self.version += 1

    def definitions(self) -> Mapping[str, ToolDefinition]:
        return {
            name: ToolDefinition(
                name=name,
                kind="backend",
                description=f"The {name} of the server.",
                source=self.name,
                origin=self.origin,
            )
            for name in self.names
        }

    def handler(self, name: str) -> ToolHandler | None:
        if name not in self.names:
            return None

        async def run(arguments: dict[str, Any], call: ToolCallInfo) -> str:
            return f"{name} says hi"

        return run


def stage(tool_config: dict[str, Any]) -> Any:
    text = json.dumps(
        {"mode": "ONESHOT", "plain": {"systemPrompt": "P"}, "toolConfig": tool_config}
    )
    return parse_agent_text(text, key="a").stage("plain")


def test_toolconfig_mcp_offers_every_tool_of_a_configured_server_as_it_is_now() -> None:
    clock = Server(CLOCK, "now", "zone")
    other = Server(ToolOrigin("mcp:other", "other"), "ping")
    registry = ToolRegistry(sources=[clock, other])
    assert isinstance(clock, OriginSource)
    offered = registry.for_stage(stage({"backends": ["zone"], "mcp": ["clock"]}))
    assert [t.name for t in offered.ordinary] == ["zone", "now"]  # named first, never twice
    clock.offer()  # the server is down: its tools are withdrawn, the agent still runs
    assert offered.ordinary == ()
    assert [t.name for t in registry.for_stage(stage({"mcp": ["clock"]})).ordinary] == []
    clock.offer("now", "alarm")
    assert [t.name for t in offered.ordinary] == ["now", "alarm"]
    assert {t.origin for t in offered.ordinary} == {CLOCK}
    with pytest.raises(ToolNotFound, match=r"mcp: 'calendar' is not a configured MCP server"):
        registry.for_stage(stage({"mcp": ["clock", "calendar"]}))


def test_a_tool_file_redescribes_a_server_tool_and_keeps_its_origin(tmp_path: Path) -> None:
    (tmp_path / "clock.backend").write_text(
        json.dumps({"tools": [{"name": "now", "description": "The time, precisely."}]})
    )
    registry = ToolRegistry(tmp_path, sources=[Server(CLOCK, "now")])
    registry.load_all()
    now = registry.get("now")
    assert now is not None
    assert (now.description, now.source, now.origin) == (
        "The time, precisely.",
        "clock.backend",
        CLOCK,
    )
    assert now.start_fields() == {"description": "The time, precisely."}


def test_agent_files_refuse_a_server_named_twice() -> None:
    with pytest.raises(
        AgentDefinitionError, match=r"mcp\[1\]: duplicate server 'clock' \(see mcp\[0\]\)"
    ):
        stage({"mcp": ["clock", "clock"]})


async def test_plan_tasks_describe_a_source_once_in_the_first_task_that_offers_it(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        add_tasks("p1", "Ask the clock", "Ask again"),
        call_turn(("c1", "now", "{}")),
        report("u1", "task_1", "completed", "asked"),
        call_turn(("c2", "now", "{}")),
        report("u2", "task_2", "completed", "asked again"),
    )
    planner = agent(
        "PLAN_EXECUTE",
        toolConfig={**tools(), "mcp": ["clock"]},
        planExecute={"plan": {"systemPrompt": "Plan."}, "execute": {"systemPrompt": "Do."}},
    )
    async with tool_gateway(tmp_path, provider, {"p": planner}) as gateway:
        gateway.app.tools.add_source(Server(CLOCK, "now"))
        events = await gateway.query("p", "What time is it?")
    task = ["task.start", "plan.update"]
    done = ["task.complete", "plan.update"]
    assert kinds(events) == [
        *HEAD,
        *CALL[:4],
        "plan.create",
        "tool.result",
        *task,
        "source.snapshot",
        *CALL,
        *CALL,
        *done,
        *task,
        *CALL,
        *CALL,
        *done,
        "run.complete",
    ]
    assert_invariants(events)
    described = events[11]
    assert (described.type, described.task_id) == ("source.snapshot", "task_1")
    assert snapshots(events) == [("mcp:clock", "Clock", "", "emoji:⏰")]
    assert result_of(events[16]) == "now says hi"
    assert [t["function"]["name"] for t in provider.requests[0]["tools"]] == ["_plan_add_tasks_"]


async def test_a_run_without_outside_tools_describes_no_source(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(call_turn(("c1", "echo", '{"text": "x"}')), answer_turn("Done"))
    async with tool_gateway(tmp_path, provider, {"a": agent(toolConfig=tools("echo"))}) as gateway:
        events = await gateway.query("a", "Echo x")
    assert kinds(events) == HEAD + CALL + ANSWER
