"""`modelConfig.extraBody`: extra request-body fields per provider, from the file to the wire."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from service.core.agents.loader import AgentDefinitionError, parse_agent_text
from service.core.model import ModelRequest
from service.providers import loopback as lb
from service.providers.loopback import LoopbackProvider
from service.providers.openai_wire import request_body
from service.testing import FAKE_PROVIDER, Harness, InProcess, ScriptedModel, write_agent
from tests.core.tools.kit import agent, answer_turn

EXTRA = {
    "*": {"seed": 7, "options": {"a": 1}},
    FAKE_PROVIDER: {"options": {"b": 2}},
    "other": {"x": 1},
}


def parse(definition: dict[str, Any]) -> Any:
    return parse_agent_text(json.dumps(definition), key="a")


def test_entries_per_provider_resolve_to_the_body_of_each_provider() -> None:
    model = parse(agent(modelConfig={"extraBody": EXTRA})).stage("plain").model
    assert model.extra_body == EXTRA
    assert model.body_for(FAKE_PROVIDER) == {"seed": 7, "options": {"b": 2}}  # its own wins
    assert model.body_for("other") == {"seed": 7, "options": {"a": 1}, "x": 1}
    assert model.body_for("third") == {"seed": 7, "options": {"a": 1}}
    assert parse(agent()).stage("plain").model.body_for(FAKE_PROVIDER) == {}


def test_a_stage_extra_body_replaces_the_outer_one_and_null_clears_it() -> None:
    stages = {
        "plan": {"systemPrompt": "P", "modelConfig": {"extraBody": {"*": {"seed": 1}}}},
        "execute": {"systemPrompt": "E", "modelConfig": {"extraBody": None}},
        "summary": {"systemPrompt": "S", "modelConfig": {"temperature": 0.1}},
    }
    definition = agent("PLAN_EXECUTE", modelConfig={"extraBody": EXTRA}, planExecute=stages)
    parsed = parse(definition)
    assert parsed.stage("plan").model.extra_body == {"*": {"seed": 1}}
    assert parsed.stage("execute").model.extra_body == {}
    assert parsed.stage("summary").model.extra_body == EXTRA
    assert parse(json.loads(json.dumps(parsed.to_json_dict()))) == parsed


@pytest.mark.parametrize(
    ("extra_body", "message"),
    [
        ({"seed": 7}, "modelConfig.extraBody.seed: Input should be a valid dictionary"),
        ([{"seed": 7}], "modelConfig.extraBody: Input should be a valid dictionary"),
        ({"": {"seed": 7}}, "modelConfig.extraBody.[key]: String should have at least 1 character"),
    ],
)
def test_extra_body_must_be_objects_per_provider(extra_body: Any, message: str) -> None:
    with pytest.raises(AgentDefinitionError) as caught:
        parse(agent(modelConfig={"extraBody": extra_body}))
    assert message in str(caught.value)


def test_the_request_extra_body_is_merged_after_the_provider_setting() -> None:
    provider_extra = {"seed": 1, "options": {"a": 1, "b": 1}}
    request = ModelRequest("p", "m", [], extra_body={"options": {"b": 2}, "top_k": 3})
    body = request_body(request, "none", provider_extra)
    assert (body["seed"], body["options"], body["top_k"]) == (1, {"a": 1, "b": 2}, 3)
    assert body["stream"] is True


async def test_the_provider_receives_its_fields_in_the_request_body(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents_dir = tmp_path / "agents"
    write_agent(agents_dir, "a", agent(modelConfig={"extraBody": EXTRA}))
    provider.enqueue(answer_turn("Hi"))
    async with Harness.start(agents_dir, provider, http_enabled=False) as gateway:
        events = await gateway.query("a", "Hello")
    assert events[-1].type == "run.complete"
    [body] = provider.requests
    assert (body["seed"], body["options"]) == (7, {"b": 2})
    assert "x" not in body


async def test_the_model_port_gets_the_fields_of_its_provider(tmp_path: Path) -> None:
    agents_dir = tmp_path / "agents"
    write_agent(agents_dir, "a", agent(modelConfig={"extraBody": EXTRA}))
    model = ScriptedModel("other")
    model.enqueue([lb.content("Hi"), lb.finish("stop")])
    async with InProcess.start(agents_dir, model) as core:
        await core.query("a", "Hello")
    assert model.requests[0].extra_body == {"seed": 7, "options": {"a": 1}, "x": 1}
