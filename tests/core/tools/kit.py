"""Helpers for the tool and mode tests: test tools, a gateway with them, stream invariants."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agw.v1 import events_pb2 as pb
from google.protobuf import json_format

from service.builtins.city_datetime import city_datetime_tool
from service.builtins.weather import mock_city_weather_tool
from service.core.events import BLOCK_ENDS, BLOCKS, TERMINALS
from service.core.tools.definitions import ToolDefinition, ToolError
from service.core.tools.registry import BackendTool, ToolCallInfo
from service.providers import loopback as lb
from service.providers.loopback import LoopbackProvider
from service.testing import Harness, write_agent

FIXED_NOW = datetime(2025, 3, 1, 4, 30, tzinfo=UTC)  # 12:30 in Shanghai


def definition(name: str, **extra: Any) -> ToolDefinition:
    return ToolDefinition(
        name=name,
        kind="backend",
        description=f"The {name} test tool.",
        parameters={"type": "object", "properties": {"text": {"type": "string"}}},
        **extra,
    )


class Probe:
    """Test tools that record their calls: echo, boom, slow (waits until released), meet,
    nap (idempotent, takes 1.5 s)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.arrived = 0
        self.all_arrived = asyncio.Event()

    async def echo(self, arguments: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
        self.calls.append(("echo", arguments))
        return {"echo": arguments.get("text", ""), "taskId": call.task_id}

    async def boom(self, arguments: dict[str, Any], call: ToolCallInfo) -> Any:
        self.calls.append(("boom", arguments))
        raise RuntimeError("kaput")

    async def refuse(self, arguments: dict[str, Any], call: ToolCallInfo) -> Any:
        raise ToolError("not today")

    async def slow(self, arguments: dict[str, Any], call: ToolCallInfo) -> str:
        self.calls.append(("slow", arguments))
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return "slow done"

    async def nap(self, arguments: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
        """Echoes after a while; idempotent: a resumed run may call it again."""
        self.calls.append(("nap", arguments))
        await asyncio.sleep(1.5)
        return {"echo": arguments.get("text", "")}

    async def meet(self, arguments: dict[str, Any], call: ToolCallInfo) -> str:
        """Returns only once two calls are running at the same time."""
        self.arrived += 1
        if self.arrived >= 2:
            self.all_arrived.set()
        await self.all_arrived.wait()
        return f"met {arguments.get('text', '')}"

    def tools(self) -> list[BackendTool]:
        return [
            BackendTool(definition("echo", after_call_hint="Quote the echo."), self.echo),
            BackendTool(definition("boom"), self.boom),
            BackendTool(definition("refuse"), self.refuse),
            BackendTool(definition("slow", timeout_s=0.3), self.slow),
            BackendTool(definition("forever"), self.slow),
            BackendTool(definition("meet", timeout_s=5), self.meet),
            BackendTool(definition("nap", idempotent=True), self.nap),
            city_datetime_tool(lambda: FIXED_NOW),
            mock_city_weather_tool(lambda: FIXED_NOW),
        ]


def write_ui_tools(directory: Path) -> Path:
    """A frontend tool `pick` (.html) and an action `theme` (.action)."""
    directory.mkdir(parents=True, exist_ok=True)
    pick = {
        "name": "pick",
        "description": "Let the user pick an option.",
        "parameters": {
            "type": "object",
            "properties": {"options": {"type": "array", "items": {"type": "string"}}},
        },
        "toolApi": "/views/pick.html",
        "toolParams": {"size": "small"},
    }
    theme = {
        "name": "theme",
        "description": "Switch the theme.",
        "parameters": {"type": "object", "properties": {"theme": {"type": "string"}}},
    }
    (directory / "pick.html").write_text(json.dumps({"tools": [pick]}))
    (directory / "ui.action").write_text(json.dumps({"tools": [theme]}))
    return directory


@asynccontextmanager
async def tool_gateway(
    tmp_path: Path,
    provider: LoopbackProvider,
    agents: dict[str, dict[str, Any]],
    probe: Probe | None = None,
    **settings: Any,
) -> AsyncIterator[Harness]:
    """A gateway on `provider` with `agents`, the UI test tools and the probe's tools."""
    agents_dir = tmp_path / "agents"
    for key, agent in agents.items():
        write_agent(agents_dir, key, agent)
    tools_dir = write_ui_tools(tmp_path / "tools")
    async with Harness.start(
        agents_dir, provider, tools_dir=tools_dir, http_enabled=False, **settings
    ) as gateway:
        for tool in (probe or Probe()).tools():
            gateway.app.tools.register(tool)
        yield gateway


def agent(mode: str = "ONESHOT", prompt: str = "Be brief.", **extra: Any) -> dict[str, Any]:
    """An agent definition of `mode` with `prompt` in each stage it needs."""
    stages: dict[str, Any] = {
        "ONESHOT": {"plain": {"systemPrompt": prompt}},
        "REACT": {"react": {"systemPrompt": prompt}},
        "PLAN_EXECUTE": {
            "planExecute": {
                "plan": {"systemPrompt": "Plan. " + prompt},
                "execute": {"systemPrompt": "Execute. " + prompt},
            }
        },
    }
    merged = {"mode": mode, **stages[mode]}
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def tools(*backends: str, frontends: tuple[str, ...] = (), actions: tuple[str, ...] = ()) -> dict:
    return {"backends": list(backends), "frontends": list(frontends), "actions": list(actions)}


# Scripts ----------------------------------------------------------------------------


def call_turn(*calls: tuple[str, str, str], reasoning: str = "") -> list[lb.ScriptItem]:
    """A turn calling tools: each (tool_call_id, name, arguments), arguments in two fragments."""
    script: list[lb.ScriptItem] = [lb.reasoning(reasoning)] if reasoning else []
    for index, (call_id, name, arguments) in enumerate(calls):
        half = len(arguments) // 2
        script += [
            lb.tool_call(index, call_id, name, arguments[:half]),
            lb.tool_call(index, arguments=arguments[half:]),
        ]
    return [*script, lb.finish("tool_calls"), lb.usage(10, 5), lb.DONE]


def answer_turn(*pieces: str, reasoning: str = "") -> list[lb.ScriptItem]:
    script: list[lb.ScriptItem] = [lb.reasoning(reasoning)] if reasoning else []
    script += [lb.content(piece) for piece in pieces]
    return [*script, lb.finish("stop"), lb.usage(10, 5), lb.DONE]


# Assertions -------------------------------------------------------------------------


def kinds(events: list[pb.Event]) -> list[str]:
    return [e.type for e in events]


def result_of(event: pb.Event) -> Any:
    field = event.WhichOneof("payload")
    assert field in ("tool_result", "action_result"), field
    return json_format.MessageToDict(getattr(event, field).result)


ID_FORMS = {
    "frontend": re.compile(r"^t_[0-9a-f]{8}$"),
    "action": re.compile(r"^a_[0-9a-f]{8}$"),
}


def assert_invariants(events: list[pb.Event]) -> None:
    """The streaming rules of SPEC §2 on one run's whole stream.

    Nested runs (subagents) too: their events come between the end of the calling
    tool's block and its result, their blocks are closed before that result, and
    their block ids count in their own namespace, `{prefix}_{toolId}_r_{n}`.
    """
    assert events, "no events"
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    run_id, chat_id = events[0].run_id, events[0].chat_id
    assert run_id and chat_id
    terminals = [i for i, e in enumerate(events) if e.WhichOneof("payload") in TERMINALS]
    assert terminals == [len(events) - 1], "exactly one terminal event, the last"
    open_blocks: dict[str, str] = {}
    parent_of: dict[str, str] = {}  # open block -> the nested run it belongs to ("" for none)
    ended: set[str] = set()
    answered: set[str] = set()
    chunks: dict[str, int] = {}
    prefixes = {"": run_id}  # nested run (its calling tool id) -> the prefix of its block ids
    counters: dict[tuple[str, str], int] = {}
    for event in events:
        field = event.WhichOneof("payload")
        assert field is not None and event.type == field.replace("_", ".", 1)
        assert (event.run_id, event.chat_id) == (run_id, chat_id)
        parent = event.parent_tool_id
        if parent:
            assert parent in ended and parent not in answered, f"{field} outside its tool call"
        prefix = prefixes[parent]
        if field in BLOCKS:
            block_id = getattr(getattr(event, field), BLOCKS[field][1])
            assert block_id not in open_blocks and block_id not in ended, block_id
            open_blocks[block_id] = field
            parent_of[block_id] = parent
            if field in ("reasoning_start", "content_start"):
                kind = "r" if field == "reasoning_start" else "c"
                n = counters[(prefix, kind)] = counters.get((prefix, kind), 0) + 1
                assert block_id == f"{prefix}_{kind}_{n}", block_id
            elif field == "action_start":
                assert ID_FORMS["action"].match(block_id), block_id
            else:
                prefixes[block_id] = f"{prefix}_{block_id}"
                if event.tool_start.tool_type not in ("backend", ""):
                    assert ID_FORMS["frontend"].match(block_id), block_id
        elif field in BLOCK_ENDS:
            block_id = getattr(getattr(event, field), BLOCK_ENDS[field])
            assert block_id in open_blocks, f"{field} of a block not open: {block_id}"
            del open_blocks[block_id]
            ended.add(block_id)
        elif field in ("reasoning_delta", "content_delta"):
            block_id = getattr(getattr(event, field), field.split("_")[0] + "_id")
            assert block_id in open_blocks, f"{field} outside its block"
        elif field in ("tool_args", "action_args"):
            payload = getattr(event, field)
            block_id = payload.tool_id if field == "tool_args" else payload.action_id
            assert block_id in open_blocks, f"{field} outside its block"
            assert payload.chunk_index == chunks.get(block_id, 0)
            chunks[block_id] = payload.chunk_index + 1
        elif field in ("tool_result", "action_result"):
            payload = getattr(event, field)
            block_id = payload.tool_id if field == "tool_result" else payload.action_id
            assert block_id in ended, f"{field} before its block ended: {block_id}"
            nested_open = [b for b in open_blocks if parent_of[b] == block_id]
            assert not nested_open, f"nested blocks open at the result of {block_id}"
            answered.add(block_id)
        elif field == "tool_progress":
            block_id = event.tool_progress.tool_id
            assert block_id in ended and block_id not in answered, f"progress of {block_id} late"
    assert not open_blocks, f"blocks left open: {open_blocks}"
