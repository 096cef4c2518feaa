"""The modes run in-process: the runtime and a ScriptedModel, without any socket.

No gRPC server, no HTTP: `InProcess` calls the runtime directly and the model is
an in-process `ModelClient`. The same scenarios as the transport tests, with
exact event sequences and the requests the model received.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agw.v1 import events_pb2 as pb

from service.core.model import Reasoning
from service.testing import (
    Gate,
    InProcess,
    ScriptedModel,
    content,
    fail,
    finish,
    reasoning,
    tool_call,
    usage,
    write_agent,
)
from tests.core.tools.kit import Probe, agent, assert_invariants, kinds, result_of, tools

HEAD = ["request.query", "chat.start", "run.start"]
THINK = ["reasoning.start", "reasoning.delta", "reasoning.end"]
CALL = ["tool.start", "tool.args", "tool.args", "tool.end", "tool.result"]
ANSWER = ["content.start", "content.delta", "content.end"]
THINKER = {"reasoning": {"enabled": True, "effort": "LOW"}}


def call_turn(call_id: str, name: str, arguments: dict[str, Any], thought: str = "") -> list:
    """A turn calling one tool, its arguments in two fragments."""
    text = json.dumps(arguments)
    half = len(text) // 2
    return [
        *([reasoning(thought)] if thought else []),
        tool_call(0, call_id, name, text[:half]),
        tool_call(0, arguments=text[half:]),
        finish("tool_calls"),
        usage(10, 5),
    ]


def answer_turn(*pieces: str) -> list:
    return [*(content(piece) for piece in pieces), finish("stop"), usage(10, 5)]


@pytest.fixture(autouse=True)
async def no_sockets() -> AsyncIterator[None]:
    """Opening any socket while the test runs fails it (the event loop has its own already)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("an in-process test opened a socket")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "__init__", refuse)
        yield


@pytest.fixture
def model() -> ScriptedModel:
    return ScriptedModel()


@pytest.fixture
async def core(tmp_path: Path, model: ScriptedModel) -> AsyncIterator[InProcess]:
    agents_dir = tmp_path / "agents"
    plan_execute = agent(
        "PLAN_EXECUTE",
        toolConfig=tools("echo"),
        planExecute={
            "plan": {"systemPrompt": "Plan it."},
            "execute": {"systemPrompt": "Do it."},
            "summary": {"systemPrompt": "Sum it up.", "toolConfig": None},
        },
    )
    for key, definition in {
        "oneshot": agent("ONESHOT", "Be brief.", modelConfig=THINKER),
        "react": agent("REACT", "Act.", toolConfig=tools("echo")),
        "plan": plan_execute,
    }.items():
        write_agent(agents_dir, key, definition)
    async with InProcess.start(agents_dir, model, builtin=Probe().tools()) as running:
        yield running


async def test_oneshot_streams_each_delta_as_it_comes(
    core: InProcess, model: ScriptedModel
) -> None:
    model.enqueue(
        [reasoning("Let me see"), content("Hel"), content("lo"), finish("stop"), usage(7, 3)]
    )
    events = await core.query("oneshot", "Hello")
    assert kinds(events) == [
        *HEAD,
        *THINK,
        *["content.start", "content.delta", "content.delta", "content.end"],
        "run.complete",
    ]
    assert_invariants(events)
    assert [e.content_delta.delta for e in events if e.type == "content.delta"] == ["Hel", "lo"]
    assert events[-1].run_complete.finish_reason == "stop"
    assert events[-1].run_complete.usage.total_tokens == 10
    [request] = model.requests
    assert request.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"},
    ]
    assert (request.reasoning, request.tools, request.tool_choice) == (
        Reasoning(True, "LOW"),
        [],
        None,
    )
    assert (request.model, request.stage) == ("fake-model", "oneshot")
    [call] = model.calls
    assert (call.deltas, call.finished, call.closed) == (5, True, True)


async def test_react_calls_a_tool_and_answers_from_its_result(
    core: InProcess, model: ScriptedModel
) -> None:
    model.enqueue(
        call_turn("c1", "echo", {"text": "hi"}, thought="I will echo."),
        answer_turn("It said ", "hi."),
    )
    events = await core.query("react", "Echo hi")
    assert kinds(events) == [
        *HEAD,
        *THINK,
        *CALL,
        *["content.start", "content.delta", "content.delta", "content.end"],
        "run.complete",
    ]
    assert_invariants(events)
    assert result_of(events[10]) == {"echo": "hi", "taskId": ""}
    first, second = model.requests
    assert [t["function"]["name"] for t in first.tools] == ["echo"]
    assert first.tool_choice is None and second.tool_choice is None
    assert [m["role"] for m in second.messages] == ["system", "user", "assistant", "tool"]
    assert second.messages[2]["tool_calls"][0]["function"] == {
        "name": "echo",
        "arguments": '{"text": "hi"}',
    }
    assert second.messages[3]["tool_call_id"] == "c1"


async def test_plan_execute_plans_two_tasks_runs_them_and_sums_up(
    core: InProcess, model: ScriptedModel
) -> None:
    tasks = {"tasks": [{"description": "Echo a"}, {"description": "Note b"}]}
    model.enqueue(
        call_turn("p1", "_plan_add_tasks_", tasks),
        call_turn("c1", "echo", {"text": "a"}),
        call_turn("u1", "_plan_update_task_", {"status": "completed", "result": "a echoed"}),
        call_turn("u2", "_plan_update_task_", {"status": "completed", "result": "b noted"}),
        answer_turn("All done."),
    )
    events = await core.query("plan", "Echo a, note b")
    assert kinds(events) == [
        *HEAD,
        *CALL[:4],
        "plan.create",
        "tool.result",
        "task.start",
        "plan.update",
        *CALL,
        *CALL,
        "task.complete",
        "plan.update",
        "task.start",
        "plan.update",
        *CALL,
        "task.complete",
        "plan.update",
        *ANSWER,
        "run.complete",
    ]
    assert_invariants(events)
    task_of = [e.task_id for e in events]
    assert set(task_of[9:23]) == {"task_1"} and set(task_of[23:32]) == {"task_2"}
    assert set(task_of[:9]) == set(task_of[32:]) == {""}
    final = events[31].plan_update.plan
    assert [(t.task_id, t.description, t.status) for t in final.tasks] == [
        ("task_1", "Echo a", pb.TASK_STATUS_COMPLETED),
        ("task_2", "Note b", pb.TASK_STATUS_COMPLETED),
    ]
    plan, task_1, _, task_2, summary = model.requests
    assert (plan.tool_choice, plan.reasoning.enabled) == ("required", False)
    assert [t["function"]["name"] for t in plan.tools] == ["_plan_add_tasks_"]
    assert [t["function"]["name"] for t in task_1.tools] == ["echo", "_plan_update_task_"]
    assert [t["function"]["name"] for t in task_2.tools] == ["echo", "_plan_update_task_"]
    assert (summary.tools, [m["role"] for m in summary.messages]) == ([], ["system", "user"])
    assert [r.stage for r in model.requests] == ["plan", "execute", "execute", "execute", "summary"]


async def test_a_provider_error_mid_stream_ends_the_run_with_run_error(
    core: InProcess, model: ScriptedModel
) -> None:
    model.enqueue([content("Part"), fail("upstream overloaded"), content("never")])
    events = await core.query("oneshot", "Hello")
    assert kinds(events) == [*HEAD, *ANSWER, "run.error"]
    assert_invariants(events)
    error = events[-1].run_error.error
    assert (error.reason, error.message) == (
        "PROVIDER_STREAM_ERROR",
        "provider 'scripted': stream error: upstream overloaded",
    )
    [call] = model.calls
    assert (call.deltas, call.finished, call.closed) == (1, False, True)


async def test_cancel_mid_stream_closes_the_model_stream(
    core: InProcess, model: ScriptedModel
) -> None:
    model.enqueue([content("Hel"), Gate(asyncio.Event()), content("lo"), finish("stop")])
    events = await core.query("oneshot", "Hello", cancel_when=lambda e: e.type == "content.delta")
    assert kinds(events) == [*HEAD, *ANSWER, "run.cancel"]
    assert_invariants(events)
    assert events[-1].run_cancel.reason == "cancel"
    [call] = model.calls
    assert (call.deltas, call.finished, call.closed) == (1, False, True)
