"""ONESHOT with tools: calls executed and fed back in OpenAI's order, errors as results."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from service.providers import loopback as lb
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
ANSWER = ["content.start", "content.delta", "content.end", "run.complete"]
CALL = ["tool.start", "tool.args", "tool.args", "tool.end", "tool.result"]


async def test_a_tool_call_is_executed_and_fed_back(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    probe = Probe()
    agents = {"a": agent(toolConfig=tools("echo"))}
    provider.enqueue(call_turn(("call_1", "echo", '{"text":"hi"}')), answer_turn("Done"))
    async with tool_gateway(tmp_path, provider, agents, probe) as gateway:
        events = await gateway.query("a", "Echo hi")
    assert kinds(events) == HEAD + CALL + ANSWER
    assert_invariants(events)
    start = events[3].tool_start
    assert (start.tool_id, start.tool_name, start.tool_type) == ("call_1", "echo", "backend")
    assert start.description == "The echo test tool."
    assert [e.tool_args.delta for e in events[4:6]] == ['{"text', '":"hi"}']
    assert [e.tool_args.chunk_index for e in events[4:6]] == [0, 1]
    assert result_of(events[7]) == {"echo": "hi", "taskId": ""}
    assert not events[7].tool_result.error
    assert probe.calls == [("echo", {"text": "hi"})]
    usage = events[-1].run_complete.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (20, 10)  # both calls

    first, second = provider.requests
    assert first["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "echo",
                "description": "The echo test tool.",
                "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
            },
        }
    ]
    assert "tool_choice" not in first
    system = first["messages"][0]["content"]
    assert system == "Be brief.\n\n## After calling a tool\n- echo: Quote the echo."
    assert second["messages"][1:] == [
        {"role": "user", "content": "Echo hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "echo", "arguments": '{"text":"hi"}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "name": "echo",
            "content": json.dumps({"echo": "hi", "taskId": ""}),
        },
    ]


async def test_parallel_calls_keep_their_ids_and_run_concurrently(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = {"a": agent(toolConfig=tools("meet"))}
    provider.enqueue(
        [
            lb.tool_calls(
                lb.tool_call_part(0, "call_a", "meet", '{"te'),
                lb.tool_call_part(1, "call_b", "meet", '{"te'),
            ),
            lb.tool_calls(
                lb.tool_call_part(0, arguments='xt":"a"}'),
                lb.tool_call_part(1, arguments='xt":"b"}'),
            ),
            lb.finish("tool_calls"),
            lb.DONE,
        ],
        answer_turn("Both met"),
    )
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        events = await gateway.query("a", "Meet twice")
    assert kinds(events) == [
        *HEAD,
        "tool.start",
        "tool.args",
        "tool.start",
        "tool.args",
        "tool.args",
        "tool.args",
        "tool.end",
        "tool.end",
        "tool.result",
        "tool.result",
        *ANSWER,
    ]
    assert_invariants(events)
    args = [(e.tool_args.tool_id, e.tool_args.chunk_index) for e in events if e.type == "tool.args"]
    assert args == [("call_a", 0), ("call_b", 0), ("call_a", 1), ("call_b", 1)]
    results = {e.tool_result.tool_id: result_of(e) for e in events if e.type == "tool.result"}
    assert results == {"call_a": "met a", "call_b": "met b"}  # neither could finish alone
    sent = provider.requests[1]["messages"]
    assert [c["id"] for c in sent[2]["tool_calls"]] == ["call_a", "call_b"]
    assert [(m["role"], m["tool_call_id"], m["content"]) for m in sent[3:]] == [
        ("tool", "call_a", "met a"),
        ("tool", "call_b", "met b"),
    ]


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("boom", "{}", "Error: 'boom' failed: RuntimeError: kaput"),
        ("refuse", "{}", "Error: not today"),
        ("slow", "{}", "Error: 'slow' timed out after 0.3 s"),
        ("nope", "{}", "Error: unknown tool 'nope' (offered tools: boom, echo, refuse, slow)"),
        ("echo", '{"text": ', "Error: the arguments are not valid JSON (Expecting value)"),
        ("echo", "[1, 2]", "Error: the arguments must be a JSON object"),
    ],
)
async def test_a_failing_call_becomes_an_error_result_and_the_run_goes_on(
    tmp_path: Path, provider: LoopbackProvider, name: str, arguments: str, message: str
) -> None:
    agents = {"a": agent(toolConfig=tools("boom", "echo", "refuse", "slow"))}
    provider.enqueue(call_turn(("call_1", name, arguments)), answer_turn("Sorry"))
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        events = await gateway.query("a", "Try")
    assert kinds(events) == HEAD + CALL + ANSWER
    result = events[7].tool_result
    assert (result.tool_id, result.error, result_of(events[7])) == ("call_1", True, message)
    assert provider.requests[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "name": name,
        "content": message,
    }


async def test_argument_templates_chain_an_earlier_result_with_date_arithmetic(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = {"a": agent(toolConfig=tools("city_datetime", "mock_city_weather"))}
    weather_args = '{"city":"Shanghai","date":"{{city_datetime.date+1d}}"}'
    provider.enqueue(
        call_turn(("call_1", "city_datetime", '{"city":"Shanghai"}')),
        call_turn(("call_2", "mock_city_weather", weather_args)),
        call_turn(("call_3", "mock_city_weather", '{"city":"X","date":"{{nothing.date}}"}')),
        answer_turn("Tomorrow is fine"),
    )
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        events = await gateway.query("a", "Weather tomorrow in Shanghai?")
    assert kinds(events) == HEAD + CALL * 3 + ANSWER
    now = result_of(events[7])
    assert (now["date"], now["time"], now["timezone"]) == (
        "2025-03-01",
        "12:30:00",
        "Asia/Shanghai",
    )
    weather = result_of(events[12])
    assert (weather["city"], weather["date"]) == ("Shanghai", "2025-03-02")
    assert result_of(events[17]) == (
        "Error: argument template: no earlier result of tool 'nothing' in this run"
    )
    # the model's own arguments are fed back as it wrote them
    assert provider.requests[2]["messages"][-2]["tool_calls"][0]["function"]["arguments"] == (
        weather_args
    )


async def test_an_agent_naming_an_unknown_tool_is_refused_before_the_run(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = {
        "a": agent(toolConfig=tools("echo", "ghost")),
        "b": agent(toolConfig=tools(frontends=("echo",))),
    }
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        for key, detail in (
            ("a", "backends: 'ghost' is not defined"),
            ("b", "frontends: 'echo' is a backend tool"),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await gateway.query(key, "hi")
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            assert detail in caught.value.details()
    assert provider.requests == []


async def test_stage_tool_config_overrides_and_null_clears(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = {
        "override": agent(
            toolConfig=tools("echo"), plain={"systemPrompt": "P", "toolConfig": tools("boom")}
        ),
        "cleared": agent(toolConfig=tools("echo"), plain={"systemPrompt": "P", "toolConfig": None}),
    }
    provider.enqueue(answer_turn("a"), answer_turn("b"))
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        await gateway.query("override", "hi")
        await gateway.query("cleared", "hi")
    override, cleared = provider.requests
    assert [t["function"]["name"] for t in override["tools"]] == ["boom"]
    assert "tools" not in cleared
