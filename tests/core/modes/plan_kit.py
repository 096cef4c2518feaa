"""Helpers for the in-process PLAN_EXECUTE tests: scripted turns, agents, a releasing driver.

Turns are played by a `ScriptedModel` in call order. Concurrent plan tasks are
made to interleave at known points with `Gate`s: `run_query` follows the run
and opens a gate when the event named for it arrives.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agw.v1 import events_pb2 as pb
from google.protobuf import json_format

from service.core.chats.history import snapshot_form
from service.core.commands import QueryCommand, SubmitCommand
from service.testing import (
    Gate,
    InProcess,
    ScriptedModel,
    content,
    finish,
    reasoning,
    tool_call,
    usage,
    write_agent,
)
from tests.core.tools.kit import Probe, agent, tools

HEAD = ["request.query", "chat.start", "run.start"]
THINK = ["reasoning.start", "reasoning.delta", "reasoning.end"]
CALL = ["tool.start", "tool.args", "tool.args", "tool.end", "tool.result"]
ANSWER = ["content.start", "content.delta", "content.end"]
#: A planning call and its announcement (plan.create / plan.revise) before its result.
PLANNED = ["tool.start", "tool.args", "tool.args", "tool.end"]


def call_turn(call_id: str, name: str, arguments: Any, *, gate: Gate | None = None) -> list:
    """A turn calling one tool, its arguments in two fragments; `gate`: wait after the first."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    half = len(text) // 2
    waiting = [gate] if gate is not None else []
    return [
        tool_call(0, call_id, name, text[:half]),
        *waiting,
        tool_call(0, arguments=text[half:]),
        finish("tool_calls"),
        usage(10, 5),
    ]


def thinking(thought: str, gate: Gate, turn: list) -> list:
    """`turn` after a reasoning delta and a wait at `gate`."""
    return [reasoning(thought), gate, *turn]


def answer_turn(*pieces: str) -> list:
    return [*(content(piece) for piece in pieces), finish("stop"), usage(10, 5)]


def plan_turn(call_id: str, *tasks: str | dict[str, Any]) -> list:
    """A `_plan_add_tasks_` call; a task is its description or its whole object."""
    listed = [t if isinstance(t, dict) else {"description": t} for t in tasks]
    return call_turn(call_id, "_plan_add_tasks_", {"tasks": listed})


def report_turn(call_id: str, task_id: str, result: str, status: str = "completed") -> list:
    arguments = {"taskId": task_id, "status": status, "result": result}
    return call_turn(call_id, "_plan_update_task_", arguments)


def echo_turn(call_id: str, text: str, *, gate: Gate | None = None) -> list:
    return call_turn(call_id, "echo", {"text": text}, gate=gate)


def decide_turn(call_id: str, decision: str, reason: str, *tasks: str | dict[str, Any]) -> list:
    arguments: dict[str, Any] = {"decision": decision, "reason": reason}
    if tasks:
        arguments["tasks"] = [t if isinstance(t, dict) else {"description": t} for t in tasks]
    return call_turn(call_id, "_plan_decide_", arguments)


def verify_turn(call_id: str, verdict: str, *improvements: str) -> list:
    arguments: dict[str, Any] = {"verdict": verdict}
    if improvements:
        arguments["improvements"] = list(improvements)
    return call_turn(call_id, "_plan_verify_", arguments)


def plan_agent(summary: bool = True, **stages: dict[str, Any]) -> dict[str, Any]:
    """A PLAN_EXECUTE agent with the echo tools; `stages` extend or add planExecute stages."""
    plan_execute: dict[str, Any] = {
        "plan": {"systemPrompt": "Plan it."},
        "execute": {"systemPrompt": "Do it."},
    }
    if summary:
        plan_execute["summary"] = {"systemPrompt": "Sum it up.", "toolConfig": None}
    for name, options in stages.items():
        plan_execute[name] = {**plan_execute.get(name, {}), **options}
    return agent("PLAN_EXECUTE", toolConfig=tools("echo", "boom"), planExecute=plan_execute)


@asynccontextmanager
async def plan_core(
    tmp_path: Path, model: ScriptedModel, agents: dict[str, dict[str, Any]]
) -> AsyncIterator[InProcess]:
    agents_dir = tmp_path / "agents"
    for key, definition in agents.items():
        write_agent(agents_dir, key, definition)
    async with InProcess.start(agents_dir, model, builtin=Probe().tools()) as core:
        yield core


@dataclass
class Release:
    """Open `gate` when an event of type `kind` of task `task_id` arrives."""

    kind: str
    task_id: str
    gate: Gate

    @staticmethod
    def when(kind: str, task_id: str = "") -> Release:
        return Release(kind, task_id, Gate(asyncio.Event()))


async def run_query(
    core: InProcess,
    key: str,
    message: str,
    *releases: Release,
    cancel_after: int = 0,
    approvals: Sequence[Any] = (),
) -> list[pb.Event]:
    """Run a query to its end, opening each release's gate once its event has streamed.

    Each `plan.approval` is answered with the next of `approvals`.
    """
    run = await core.frontdoor.query(QueryCommand(key, message))
    events: list[pb.Event] = []
    waiting = list(releases)
    answers = list(approvals)
    async for event in run.follow(0):
        events.append(event)
        if event.type == "plan.approval":
            answer = SubmitCommand(run.run_id, event.plan_approval.approval_id, answers.pop(0))
            assert (await core.frontdoor.submit(answer)).accepted
        for release in waiting:
            if (event.type, event.task_id) == (release.kind, release.task_id):
                release.gate.event.set()
                waiting.remove(release)
                break
        if cancel_after and len(events) == cancel_after:
            await core.frontdoor.cancel(run.run_id)
    return events


def comparable(events: list[pb.Event]) -> list[dict[str, Any]]:
    """Events as JSON data without seq and timestamp."""
    out = []
    for event in events:
        data = json_format.MessageToDict(event)
        data.pop("seq", None)
        data.pop("timestamp", None)
        out.append(data)
    return out


async def assert_replayed(core: InProcess, live: list[pb.Event]) -> None:
    """GetChat replays the snapshot form of `live`; Attach from every seq gives the rest."""
    run_id = live[0].run_id
    for after in range(len(live) + 1):
        assert [e async for e in await core.frontdoor.attach(run_id, after)] == live[after:]
    run = core.frontdoor.runs.get(run_id)
    if run is not None:  # its end is being recorded
        await run.ended()
    await core.frontdoor.flush()
    view = await core.frontdoor.get_chat(live[0].chat_id)
    assert comparable(view.events) == comparable(snapshot_form(live))
    assert [e.seq for e in view.events] == list(range(1, len(view.events) + 1))


def task_ids(events: list[pb.Event], kind: str) -> list[str]:
    """The task ids of the events of type `kind`, in order."""
    return [e.task_id for e in events if e.type == kind]


def statuses(plan: pb.Plan) -> list[tuple[str, str]]:
    return [
        (t.task_id, pb.TaskStatus.Name(t.status).removeprefix("TASK_STATUS_")) for t in plan.tasks
    ]
