"""Tool sources: a source of its own registered into the registry, resolved per turn."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from service.core.agents.loader import parse_agent_text
from service.core.tools.definitions import ToolDefinition, ToolKind
from service.core.tools.registry import ToolRegistry
from service.core.tools.sources import BackendTool, ToolCallInfo, ToolHandler
from service.providers.loopback import LoopbackProvider
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

HEAD = ["request.query", "chat.start", "run.start"]
CALL = ["tool.start", "tool.args", "tool.args", "tool.end", "tool.result"]
ANSWER = ["content.start", "content.delta", "content.end", "run.complete"]


def definition(
    name: str, description: str = "", kind: ToolKind = "backend", **extra: Any
) -> ToolDefinition:
    return ToolDefinition(
        name=name,
        kind=kind,
        description=description or f"The shelf's {name}.",
        source="shelf",
        **extra,
    )


class Shelf:
    """A source whose tools are put on and taken off while the service runs."""

    name = "shelf"

    def __init__(self, *tools: BackendTool, executes: bool = True) -> None:
        self.executes = executes
        self.version = 0
        self.tools = {t.definition.name: t for t in tools}
        self.errors: Mapping[str, str] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def put(self, tool: BackendTool) -> None:
        self.tools = {**self.tools, tool.definition.name: tool}
        self.version += 1

    def take(self, name: str) -> BackendTool:
        tools = dict(self.tools)
        taken = tools.pop(name)
        self.tools = tools
        self.version += 1
        return taken

    def definitions(self) -> Mapping[str, ToolDefinition]:
        return {name: tool.definition for name, tool in self.tools.items()}

    def handler(self, name: str) -> ToolHandler | None:
        tool = self.tools.get(name)
        return tool.handler if tool is not None else None

    def tool(self, name: str, description: str = "", **extra: Any) -> BackendTool:
        """A backend tool of the shelf that records its calls and answers with its name."""

        async def run(arguments: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
            self.calls.append((name, arguments))
            return {"tool": name, "arguments": arguments}

        return BackendTool(definition(name, description, **extra), run)


# -- in the registry ----------------------------------------------------------------------


def test_sources_resolve_in_order_and_a_change_is_seen_at_the_next_read(tmp_path: Path) -> None:
    shelf = Shelf()
    shelf.put(shelf.tool("lookup", timeout_s=7.0))
    shelf.put(shelf.tool("echo"))  # a built-in already has the name
    (tmp_path / "lookup.backend").write_text(
        json.dumps({"tools": [{"name": "lookup", "description": "Look it up."}]})
    )
    registry = ToolRegistry(tmp_path, builtin=Probe().tools()[:1], sources=[shelf])
    registry.load_all()
    assert [(t.name, t.source, t.description) for t in registry.list()] == [
        ("echo", "built-in", "The echo test tool."),
        ("lookup", "lookup.backend", "Look it up."),  # a tool file redescribes the shelf's
    ]
    assert registry.get("lookup").timeout_s == 7.0  # type: ignore[union-attr]
    assert registry.handler("lookup") is shelf.tools["lookup"].handler
    assert registry.errors == {"shelf": "shelf: 'echo': already defined in built-in"}

    version = registry.version
    shelf.take("echo")
    shelf.put(shelf.tool("late"))
    assert registry.get("late") is not None and registry.version == version + 1
    assert registry.handler("late") is shelf.tools["late"].handler
    assert registry.errors == {}
    shelf.take("late")
    assert registry.get("late") is None and registry.handler("late") is None


def test_a_describing_source_cannot_define_a_backend_tool(tmp_path: Path) -> None:
    catalog = Shelf(executes=False)
    catalog.put(catalog.tool("ghost"))
    catalog.put(BackendTool(definition("theme", kind="action"), catalog.tool("theme").handler))
    registry = ToolRegistry(sources=[catalog])
    assert [t.name for t in registry.list()] == ["theme"]
    assert registry.handler("theme") is None  # a describing source runs nothing
    assert registry.errors == {
        "shelf": "shelf: 'ghost': no such built-in backend tool (a .backend file can only "
        "describe built-ins)"
    }


def test_a_stage_offers_the_tools_as_they_are_now(tmp_path: Path) -> None:
    shelf = Shelf()
    shelf.put(shelf.tool("lookup"))
    shelf.put(shelf.tool("late"))
    registry = ToolRegistry(sources=[shelf])
    config = {
        "mode": "ONESHOT",
        "plain": {"systemPrompt": "P"},
        "toolConfig": tools("lookup", "late"),
    }
    stage = registry.for_stage(parse_agent_text(json.dumps(config), key="a").stage("plain"))
    assert [t.name for t in stage.ordinary] == ["lookup", "late"]
    shelf.take("late")
    assert [t.name for t in stage.ordinary] == ["lookup"] and list(stage.by_name) == ["lookup"]
    shelf.put(shelf.tool("late", "Late, changed."))
    assert [s["function"]["description"] for s in stage.schemas()] == [
        "The shelf's lookup.",
        "Late, changed.",
    ]


# -- through a query ----------------------------------------------------------------------


async def test_a_tool_of_a_registered_source_runs_through_a_query(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    shelf = Shelf()
    shelf.put(shelf.tool("lookup"))
    agents = {"a": agent(toolConfig=tools("lookup"))}
    provider.enqueue(call_turn(("c1", "lookup", '{"q":"x"}')), answer_turn("Found"))
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        gateway.app.tools.add_source(shelf)
        events = await gateway.query("a", "Look x up")
    assert kinds(events) == HEAD + CALL + ANSWER
    assert_invariants(events)
    start = events[3].tool_start
    assert (start.tool_name, start.tool_type, start.description) == (
        "lookup",
        "backend",
        "The shelf's lookup.",
    )
    assert result_of(events[7]) == {"tool": "lookup", "arguments": {"q": "x"}}
    assert shelf.calls == [("lookup", {"q": "x"})]
    assert [t["function"]["name"] for t in provider.requests[0]["tools"]] == ["lookup"]


async def test_a_tool_the_source_adds_between_turns_is_callable_on_the_next_turn(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    """The agent names `late`; the shelf takes it off during turn 1 and puts it back in turn 3.

    (A query naming a tool no source defines is refused when it starts, so `late` is
    on the shelf when the query starts.)
    """
    shelf = Shelf()
    spare = shelf.tool("late")
    shelf.put(spare)

    async def edit(arguments: dict[str, Any], call: ToolCallInfo) -> str:
        if arguments.get("take"):
            shelf.take("late")
            return "taken"
        shelf.put(spare)
        return "put back"

    shelf.put(BackendTool(definition("edit"), edit))
    agents = {"a": agent(toolConfig=tools("edit", "late"))}
    provider.enqueue(
        call_turn(("c1", "edit", '{"take":true}')),
        call_turn(("c2", "late", '{"n":1}')),  # not offered in this turn: an error result
        call_turn(("c3", "edit", '{"put":true}')),
        call_turn(("c4", "late", '{"n":2}')),
        answer_turn("Done"),
    )
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        gateway.app.tools.add_source(shelf)
        events = await gateway.query("a", "Shuffle")
    assert kinds(events) == HEAD + CALL * 4 + ANSWER
    assert_invariants(events)
    offered = [[t["function"]["name"] for t in r["tools"]] for r in provider.requests]
    assert offered == [
        ["edit", "late"],
        ["edit"],
        ["edit"],
        ["edit", "late"],
        ["edit", "late"],
    ]
    results = [result_of(e) for e in events if e.type == "tool.result"]
    assert results == [
        "taken",
        "Error: unknown tool 'late' (offered tools: edit)",
        "put back",
        {"tool": "late", "arguments": {"n": 2}},
    ]
    assert [e.tool_result.error for e in events if e.type == "tool.result"] == [
        False,
        True,
        False,
        False,
    ]
    assert shelf.calls == [("late", {"n": 2})]
