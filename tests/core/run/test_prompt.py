"""Prompt variables through a real query: the request's params, scene, caller and start
time reach the system prompts, checked when the agent file loads and fixed for the run."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from agw.v1 import gateway_pb2 as gw
from google.protobuf import struct_pb2

from service.providers.loopback import LoopbackProvider
from service.testing import Harness, write_agent
from tests.core.tools.kit import agent, answer_turn, call_turn, tools, write_ui_tools

PROMPT = (
    "Today is {{date}}, now {{now}}, due {{params.due+1d}}. User: {{user}}. "
    "City: {{params.city}}; count {{params.count}}; missing [{{params.nope}}]; "
    "page {{scene.page}}; scene {{scene}}. Literal \\{{city_datetime.date}}."
)


def struct(value: dict) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    message.update(value)
    return message


async def test_params_scene_and_the_start_time_fill_the_system_prompt(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = tmp_path / "agents"
    write_agent(agents, "vars", {"mode": "ONESHOT", "plain": {"systemPrompt": PROMPT}})
    provider.enqueue(answer_turn("ok"))
    before = time.time()
    async with Harness.start(agents, provider, http_enabled=False) as gateway:
        events = await gateway.query(
            "vars",
            "Hi",
            params=struct({"city": "Paris", "count": 3, "due": "2025-03-01"}),
            scene=struct({"page": "checkout"}),
        )
    after = time.time()
    assert events[-1].type == "run.complete"
    system = provider.requests[0]["messages"][0]
    assert system["role"] == "system"
    text = system["content"]
    now = datetime.fromisoformat(text.split("now ")[1].split(",")[0].replace("Z", "+00:00"))
    assert before - 1 <= now.timestamp() <= after
    assert text == (
        f"Today is {now.date().isoformat()}, now {now.isoformat().replace('+00:00', 'Z')}, "
        "due 2025-03-02. User: . City: Paris; count 3; missing []; page checkout; "
        'scene {"page": "checkout"}. Literal {{city_datetime.date}}.'
    )
    # the query event keeps what the request sent
    assert events[0].request_query.params["city"] == "Paris"


async def test_a_prompt_date_that_cannot_shift_refuses_the_query(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = tmp_path / "agents"
    write_agent(agents, "vars", agent(prompt="Due {{params.due+1d}}."))
    async with Harness.start(agents, provider, http_enabled=False) as gateway:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await gateway.query("vars", "Hi", params=struct({"due": "soon"}))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == (
        "system prompt: {{params.due+1d}}: 'soon' is not an ISO date or date-time"
    )
    assert provider.requests == []


async def test_an_unknown_variable_is_a_load_error_naming_file_field_and_variable(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = tmp_path / "agents"
    write_agent(agents, "good", agent(prompt="Hello {{user}}."))
    write_agent(agents, "bad", agent("REACT", prompt="Hello {{usr}}, it is {{date.day}}."))
    async with Harness.start(agents, provider, http_enabled=False) as gateway:
        listed = await gateway.stub.ListAgents(gw.ListAgentsRequest())
        errors = dict(gateway.app.agents.errors)
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await gateway.query("bad", "Hi")
    assert [a.key for a in listed.agents] == ["good"]
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert list(errors) == ["bad.json"]
    assert errors["bad.json"] == (
        "bad.json: react.systemPrompt: unknown prompt variable '{{usr}}' (the variables are "
        "date, now, user, params, scene; write \\{{ for literal braces); react.systemPrompt: "
        "'{{date.day}}': date has no fields"
    )


async def test_date_and_now_stay_those_of_the_runs_start_when_it_resumes(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    """A run waiting for a frontend tool is handed over at shutdown and resumed by the next
    process: its next model call's prompt has the start time the run began with."""
    agents = tmp_path / "agents"
    write_agent(
        agents, "waiter", agent(prompt="Started {{now}}.", toolConfig=tools(frontends=("pick",)))
    )
    tools_dir = write_ui_tools(tmp_path / "tools")
    provider.enqueue(call_turn(("f1", "pick", '{"options": ["a"]}')), answer_turn("Picked."))
    settings = {"tools_dir": tools_dir, "http_enabled": False, "shutdown_grace_s": 0.1}
    async with Harness.start(agents, provider, **settings) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="waiter", message="Pick"))
        first = []
        async for event in call:
            first.append(event)
            if event.type == "tool.end":
                break
        call.cancel()
    await asyncio.sleep(1.1)  # a second later: a clock read anew would differ
    async with Harness.start(agents, provider, **settings) as gateway:
        tool_id = first[-1].tool_end.tool_id
        run_id = first[0].run_id
        reply = await gateway.stub.Submit(
            gw.SubmitRequest(
                run_id=run_id, tool_id=tool_id, payload=struct_pb2.Value(string_value="a")
            )
        )
        assert reply.accepted, reply
        rest = [e async for e in gateway.stub.Attach(gw.AttachRequest(run_id=run_id))]
    assert "run.resume" in [e.type for e in rest] and rest[-1].type == "run.complete"
    prompts = [r["messages"][0]["content"] for r in provider.requests]
    assert len(prompts) == 2 and prompts[0] == prompts[1]
    started = datetime.fromisoformat(prompts[0].removeprefix("Started ").rstrip("."))
    assert abs(started - datetime.fromtimestamp(first[0].timestamp / 1000, UTC)) < timedelta(
        seconds=1
    )
