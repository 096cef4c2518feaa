"""The `agw` session: plans, tasks, questions, permissions, approvals and frontend tools.

The service's plan mode, questions and permissions stream these events; here a
scripted `AgentGateway` (an edge fake on a real loopback gRPC server) plays them,
so that the rendering and the answers `Submit` carries are checked exactly.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc
from agw_client import Client
from agw_client.cli import frontend
from agw_client.cli.render import Renderer, ToolCall
from agw_client.cli.session import Prompter, Session
from agw_client.messages import from_value, to_value

from service.testing import serve_gateway
from tests.clients.conftest import start_agw

Context = grpc.aio.ServicerContext[Any, Any]


def plan(*statuses: pb.TaskStatus.ValueType) -> pb.Plan:
    names = ["Find flights", "Book hotel"]
    return pb.Plan(
        tasks=[
            pb.Task(task_id=f"t{i}", description=names[i], status=status)
            for i, status in enumerate(statuses)
        ]
    )


INIT, RUNNING, DONE = pb.TASK_STATUS_INIT, pb.TASK_STATUS_IN_PROGRESS, pb.TASK_STATUS_COMPLETED


class ScriptedGateway(gateway_pb2_grpc.AgentGatewayServicer):
    """Streams a plan-and-ask run; each ask waits until `Submit` answers it."""

    def __init__(self) -> None:
        self.submitted: list[tuple[str, Any]] = []
        self._answered: asyncio.Queue[str] = asyncio.Queue()

    async def Query(self, request: Any, context: Context) -> None:  # type: ignore[override]
        seq = 0

        async def send(**payload: Any) -> None:
            nonlocal seq
            seq += 1
            await context.write(pb.Event(seq=seq, run_id="r1", chat_id="c1", **payload))

        await send(run_start=pb.RunStart(agent_key="planner"))
        await send(plan_create=pb.PlanCreate(plan_id="p", plan=plan(INIT, INIT)))
        await send(
            plan_approval=pb.PlanApproval(plan_id="p", approval_id="a1", plan=plan(INIT, INIT))
        )
        assert await self._answered.get() == "a1"
        await send(task_start=pb.TaskStart(description="Find flights"), task_id="t0")
        await send(plan_update=pb.PlanUpdate(plan_id="p", plan=plan(RUNNING, INIT)))
        question = pb.QuestionAsk(question_id="q1", question="Window or aisle?")
        question.options.extend(["Window", "Aisle"])
        await send(question_ask=question, task_id="t0")
        assert await self._answered.get() == "q1"
        ask = pb.PermissionAsk(permission_id="p1", tool_name="book", arguments='{"seat": "2A"}')
        await send(permission_ask=ask, task_id="t0")
        assert await self._answered.get() == "p1"
        await send(permission_answer=pb.PermissionAnswer(permission_id="p1", reason="user"))
        await send(task_complete=pb.TaskComplete(description="Flight booked"), task_id="t0")
        await send(plan_update=pb.PlanUpdate(plan_id="p", plan=plan(DONE, INIT)))
        await send(run_complete=pb.RunComplete(finish_reason="stop"))

    async def Submit(self, request: gw.SubmitRequest, context: Context) -> gw.SubmitResponse:
        self.submitted.append((request.tool_id, from_value(request.payload)))
        await self._answered.put(request.tool_id)
        return gw.SubmitResponse(accepted=True, outcome=gw.SUBMIT_OUTCOME_ACCEPTED)


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[ScriptedGateway, str]]:
    servicer = ScriptedGateway()  # type: ignore[abstract]
    async with serve_gateway(servicer) as target:
        yield servicer, target


async def test_plan_tasks_and_every_kind_of_wait(scripted: tuple[ScriptedGateway, str]) -> None:
    servicer, target = scripted
    out, err = io.StringIO(), io.StringIO()
    answers: Iterator[str] = iter(["y", "2", "no"])

    def read(prompt: str) -> str:
        out.write(prompt)
        return next(answers)

    def follow() -> str:
        renderer = Renderer(out, err, color=False)
        with Client(target) as client:
            session = Session(client, renderer, Prompter(renderer, read, echo=True))
            return session.follow(client.query("planner", "Trip to Rome")).outcome

    assert await asyncio.to_thread(follow) == "complete"
    assert servicer.submitted == [("a1", True), ("q1", "Aisle"), ("p1", False)]
    assert out.getvalue().splitlines() == [
        "plan:",
        "  [ ] Find flights",
        "  [ ] Book hotel",
        "  [ ] Find flights",
        "  [ ] Book hotel",
        "approve this plan? [y/N] y",
        "▶ Find flights",
        "plan 0/2: [>] Find flights",
        "? Window or aisle?",
        "  1. Window",
        "  2. Aisle",
        "your answer: 2",
        'allow book {"seat": "2A"}? [y/N] no',
        "permission denied (user)",
        "✓ Flight booked",
        "plan 1/2: [x] Find flights",
    ]
    assert err.getvalue() == ""


def test_a_frontend_tool_is_described_with_its_view_and_how_to_answer() -> None:
    call = ToolCall(
        name="confirm_dialog",
        type="html",
        arguments='{"question": "Go?", "options": ["Yes", "No"], "level": 2}',
        description='Ask the user.\n  Returns e.g. {"choice": "Yes"}.',
        api="/views/confirm_dialog.html",
        params={"width": 420, "submitLabel": "Send"},
    )
    assert frontend.describe(call) == [
        "? confirm_dialog (html) waits for your answer",
        '  Ask the user. Returns e.g. {"choice": "Yes"}.',
        "  question: Go?",
        "  options:",
        "    1. Yes",
        "    2. No",
        "  level: 2",
        '  view: /views/confirm_dialog.html {"submitLabel": "Send", "width": 420}',
        '  answer with an option\'s number, JSON ({"key": "value"}, 42, true) or plain text',
    ]
    options = frontend.options_of(frontend.arguments_of(call))
    assert [frontend.answer_of(text, options) for text in ("1", " 2 ", "3", "Maybe")] == [
        "Yes",
        "No",
        3,
        "Maybe",
    ]


def test_arguments_that_are_not_an_object_are_shown_as_they_came() -> None:
    call = ToolCall(name="sketch", type="qlc", arguments='{"unfinished": ')
    assert frontend.describe(call) == [
        "? sketch (qlc) waits for your answer",
        '  arguments: {"unfinished":',
        '  answer with JSON ({"key": "value"}, 42, true) or plain text',
    ]
    assert frontend.options_of(["a", "b"]) == []
    assert frontend.options_of({"options": [{"nested": 1}]}) == []


def test_typed_answers_are_json_when_they_are_json() -> None:
    assert [frontend.parse_answer(text) for text in ("1", "2.5", "true", "null", "[1, 2]")] == [
        1,
        2.5,
        True,
        None,
        [1, 2],
    ]
    assert isinstance(frontend.parse_answer("1"), int)
    assert frontend.parse_answer('{"a": 1}') == {"a": 1}
    # Not JSON (or not JSON that can be sent): the text itself.
    for text in ("blue", "NaN", "Infinity", "-Infinity", "{oops", "1 2"):
        assert frontend.parse_answer(text) == text


def test_integral_doubles_read_back_as_ints() -> None:
    value = to_value({"n": 1, "x": 2.5, "big": 2.0**60, "list": [3, -0.0]})
    plain = from_value(value)
    assert plain == {"n": 1, "x": 2.5, "big": 2.0**60, "list": [3, 0]}
    assert isinstance(plain["n"], int) and isinstance(plain["big"], float)
    assert json.dumps(from_value(to_value(1))) == "1"


class BrokenGateway(gateway_pb2_grpc.AgentGatewayServicer):
    """Streams half an answer, then fails the call."""

    async def Query(self, request: Any, context: Context) -> None:  # type: ignore[override]
        await context.write(pb.Event(seq=1, run_id="r1", content_start=pb.ContentStart()))
        await context.write(
            pb.Event(seq=2, run_id="r1", content_delta=pb.ContentDelta(delta="Hal"))
        )
        await context.abort(grpc.StatusCode.INTERNAL, "the stream broke")


async def test_output_cut_short_by_a_failure_still_ends_its_line() -> None:
    async with serve_gateway(BrokenGateway()) as target:  # type: ignore[abstract]
        process = await start_agw(target, "query", "any", "Hi")
        out, err = await asyncio.wait_for(process.communicate(), 60)
    assert (process.returncode, out.decode()) == (1, "Hal\n")
    assert err.decode() == "agw: INTERNAL: the stream broke\n"


class QuestionGateway(gateway_pb2_grpc.AgentGatewayServicer):
    """Streams two structured questions; each waits until `Submit` answers it."""

    def __init__(self) -> None:
        self.submitted: list[tuple[str, Any]] = []
        self._answered: asyncio.Queue[str] = asyncio.Queue()

    async def Query(self, request: Any, context: Context) -> None:  # type: ignore[override]
        choices = [
            pb.QuestionOption(label="Paris", description="Museums", recommended=True),
            pb.QuestionOption(label="Rome", description="Ruins"),
            pb.QuestionOption(label="Oslo"),
        ]
        several = pb.QuestionAsk(
            question_id="q1",
            question="Which cities?",
            options=[c.label for c in choices],
            choices=choices,
            multi_select=True,
        )
        own = pb.QuestionAsk(
            question_id="q2", question="Which hotel?", options=["Grand"], allow_free_text=True
        )
        await context.write(pb.Event(seq=1, run_id="r1", chat_id="c1", question_ask=several))
        assert await self._answered.get() == "q1"
        await context.write(pb.Event(seq=2, run_id="r1", chat_id="c1", question_ask=own))
        assert await self._answered.get() == "q2"
        done = pb.RunComplete(finish_reason="stop")
        await context.write(pb.Event(seq=3, run_id="r1", chat_id="c1", run_complete=done))

    async def Submit(self, request: gw.SubmitRequest, context: Context) -> gw.SubmitResponse:
        self.submitted.append((request.tool_id, from_value(request.payload)))
        await self._answered.put(request.tool_id)
        return gw.SubmitResponse(accepted=True, outcome=gw.SUBMIT_OUTCOME_ACCEPTED)


async def test_structured_questions_at_the_terminal() -> None:
    servicer = QuestionGateway()  # type: ignore[abstract]
    out, err = io.StringIO(), io.StringIO()
    answers: Iterator[str] = iter(["9", "Lisbon", "1, rome", "Lisbon"])

    def read(prompt: str) -> str:
        out.write(prompt)
        return next(answers)

    def follow(target: str) -> str:
        renderer = Renderer(out, err, color=False)
        with Client(target) as client:
            session = Session(client, renderer, Prompter(renderer, read, echo=True))
            return session.follow(client.query("trip", "Plan")).outcome

    async with serve_gateway(servicer) as target:
        assert await asyncio.to_thread(follow, target) == "complete"
    assert servicer.submitted == [("q1", ["Paris", "Rome"]), ("q2", "Lisbon")]
    assert out.getvalue().splitlines() == [
        "? Which cities?",
        "  1. Paris (recommended) — Museums",
        "  2. Rome — Ruins",
        "  3. Oslo",
        "your choices (numbers or labels, separated by commas): 9",
        "your choices (numbers or labels, separated by commas): Lisbon",
        "your choices (numbers or labels, separated by commas): 1, rome",
        "? Which hotel?",
        "  1. Grand",
        "your answer (a number, or your own words): Lisbon",
    ]
    assert err.getvalue().splitlines() == [
        "choose by the number or the label of an option",
        "choose by the number or the label of an option",
    ]


def test_a_tool_s_answer_schema_is_shown_and_shapes_the_answer() -> None:
    schema = {
        "type": "object",
        "properties": {"choice": {"type": "string"}},
        "required": ["choice"],
    }
    call = ToolCall(
        name="confirm_dialog",
        type="html",
        arguments='{"question": "Go?", "options": ["Yes", "No"]}',
        answer_schema=schema,
    )
    assert frontend.describe(call)[-2:] == [
        '  answer: {"choice": string}',
        '  answer with an option\'s number, JSON ({"key": "value"}, 42, true) or plain text',
    ]
    options = frontend.options_of(frontend.arguments_of(call))
    answers = [frontend.answer_of(text, options, schema) for text in ("1", "Maybe", "7")]
    assert answers == [{"choice": "Yes"}, {"choice": "Maybe"}, {"choice": 7}]
    # An object typed in full is sent as it is; a schema of several fields wraps nothing.
    assert frontend.answer_of('{"choice": "No"}', options, schema) == {"choice": "No"}
    two = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}
    assert frontend.answer_of("x", [], two) == "x"
    assert frontend.shape_of(two) == '{"a": string, "b": integer}'
    assert frontend.shape_of({"type": "array", "items": {"enum": ["x", 1]}}) == '["x" | 1]'
