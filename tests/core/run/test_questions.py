"""Structured questions of `ask_user`: typed options, several choices, free text, in-process."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agw.v1 import events_pb2 as pb

from service.builtins.ask_user import ask_user_tool
from service.core.commands import QueryCommand, SubmitCommand
from service.core.events import from_value
from service.testing import InProcess, ScriptedModel, write_agent
from tests.core.modes.test_escalation import replayed
from tests.core.modes.test_inprocess import answer_turn, call_turn
from tests.core.tools.kit import agent, assert_invariants, kinds, result_of, tools

HEAD = ["request.query", "chat.start", "run.start"]
ASKED = ["tool.start", "tool.args", "tool.args", "tool.end", "question.ask"]
ANSWERED = ["request.submit", "question.answer", "tool.result"]
ANSWER = ["content.start", "content.delta", "content.end"]
OSLO = {"label": "Oslo", "description": "Cold and clear", "recommended": True}


@pytest.fixture
def model() -> ScriptedModel:
    return ScriptedModel()


@pytest.fixture
async def core(tmp_path: Path, model: ScriptedModel) -> AsyncIterator[InProcess]:
    agents_dir = tmp_path / "agents"
    write_agent(agents_dir, "asker", agent("REACT", "Ask.", toolConfig=tools("ask_user")))
    async with InProcess.start(agents_dir, model, builtin=[ask_user_tool(60.0)]) as running:
        yield running


async def ask(core: InProcess, answer: Any) -> tuple[list[pb.Event], Any]:
    """Run the asker, answering its question with `answer`; the events and the Submit result."""
    run = await core.frontdoor.query(QueryCommand("asker", "Where to?"))
    events, outcome = [], None
    async for event in run.follow(0):
        events.append(event)
        if event.type == "question.ask":
            command = SubmitCommand(run.run_id, event.question_ask.question_id, answer)
            outcome = await core.frontdoor.submit(command)
    return events, outcome


async def test_typed_options_several_choices_and_free_text(
    core: InProcess, model: ScriptedModel
) -> None:
    arguments = {
        "question": "Which cities?",
        "options": [OSLO, "Rome"],
        "multiSelect": True,
        "allowFreeText": True,
    }
    model.enqueue(call_turn("q1", "ask_user", arguments), answer_turn("Oslo and Rome."))
    events, outcome = await ask(core, ["Oslo", "Rome", "Porto"])
    assert outcome is not None and outcome.accepted
    assert kinds(events) == [*HEAD, *ASKED, *ANSWERED, *ANSWER, "run.complete"]
    assert_invariants(events)
    question = events[7].question_ask
    assert (question.question, list(question.options)) == ("Which cities?", ["Oslo", "Rome"])
    assert [(c.label, c.description, c.recommended) for c in question.choices] == [
        ("Oslo", "Cold and clear", True),
        ("Rome", "", False),
    ]
    assert (question.multi_select, question.allow_free_text) == (True, True)
    assert question.question_id.startswith("q_") and question.timeout_ms == 300_000
    assert from_value(events[9].question_answer.answer) == ["Oslo", "Rome", "Porto"]
    assert result_of(events[10]) == ["Oslo", "Rome", "Porto"]
    assert json.loads(model.requests[1].messages[-1]["content"]) == ["Oslo", "Rome", "Porto"]
    await replayed(core, events)


async def test_plain_labels_ask_as_before(core: InProcess, model: ScriptedModel) -> None:
    arguments = {"question": "Which city?", "options": ["Oslo", "Rome"]}
    model.enqueue(call_turn("q1", "ask_user", arguments), answer_turn("Rome."))
    events, _ = await ask(core, "Rome")
    question = events[7].question_ask
    assert list(question.options) == ["Oslo", "Rome"]
    assert (list(question.choices), question.multi_select, question.allow_free_text) == (
        [],
        False,
        False,
    )
    assert result_of(events[10]) == "Rome"


@pytest.mark.parametrize(
    ("options", "extra", "error"),
    [
        ([{"description": "no label"}], {}, "options[0].label must be a non-empty string"),
        ([3], {}, "options[0] must be a label or an object with a label"),
        (["A", {"label": "A"}], {}, "'options' must not repeat a label"),
        (["A"], {"multiSelect": "yes"}, "'multiSelect' must be true or false"),
    ],
)
async def test_malformed_options_are_an_error_result(
    core: InProcess, model: ScriptedModel, options: list, extra: dict, error: str
) -> None:
    arguments = {"question": "Which?", "options": options, **extra}
    model.enqueue(call_turn("q1", "ask_user", arguments), answer_turn("Sorry."))
    events, outcome = await ask(core, "unused")
    assert outcome is None
    assert kinds(events) == [*HEAD, *ASKED[:4], "tool.result", *ANSWER, "run.complete"]
    assert result_of(events[7]) == f"Error: {error}"
