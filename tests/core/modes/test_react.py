"""REACT: at most one tool per round, at most react.maxSteps rounds, then a final answer."""

from __future__ import annotations

from pathlib import Path

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
THINK = ["reasoning.start", "reasoning.delta", "reasoning.end"]
CALL = ["tool.start", "tool.args", "tool.args", "tool.end", "tool.result"]
ANSWER = ["content.start", "content.delta", "content.end", "run.complete"]
THINKER = {"reasoning": {"enabled": True, "effort": "LOW"}}


async def test_one_tool_per_round_the_others_are_refused(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    probe = Probe()
    agents = {"r": agent("REACT", toolConfig=tools("echo"), modelConfig=THINKER)}
    provider.enqueue(
        call_turn(("c1", "echo", '{"text":"a"}'), ("c2", "echo", '{"text":"b"}'), reasoning="Hm"),
        call_turn(("c3", "echo", '{"text":"b"}'), reasoning="Now b"),
        answer_turn("a and b", reasoning="Done"),
    )
    async with tool_gateway(tmp_path, provider, agents, probe) as gateway:
        events = await gateway.query("r", "Echo a and b")
    assert kinds(events) == [
        *HEAD,
        *THINK,
        "tool.start",
        "tool.args",
        "tool.args",
        "tool.start",
        "tool.args",
        "tool.args",
        "tool.end",
        "tool.end",
        "tool.result",
        "tool.result",
        *THINK,
        *CALL,
        *THINK,
        *ANSWER,
    ]
    assert_invariants(events)
    results = [
        (e.tool_result.tool_id, e.tool_result.error) for e in events if e.type == "tool.result"
    ]
    assert results == [("c1", False), ("c2", True), ("c3", False)]
    refused = next(e for e in events if e.type == "tool.result" and e.tool_result.error)
    assert "only one tool call per round" in result_of(refused)
    assert probe.calls == [("echo", {"text": "a"}), ("echo", {"text": "b"})]
    second = provider.requests[1]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "tool"]
    assert [m["tool_call_id"] for m in second[3:]] == ["c1", "c2"]
    assert events[-1].run_complete.finish_reason == "stop"


async def test_after_max_steps_the_model_must_answer(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = {
        "r": agent(
            "REACT",
            toolConfig=tools("echo"),
            react={"systemPrompt": "Act.", "maxSteps": 2},
        )
    }
    provider.enqueue(
        call_turn(("c1", "echo", "{}")),
        call_turn(("c2", "echo", "{}")),
        answer_turn("Final"),
    )
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        events = await gateway.query("r", "Loop")
    assert kinds(events) == HEAD + CALL * 2 + ANSWER
    assert [r.get("tool_choice") for r in provider.requests] == [None, None, "none"]
    assert [len(r["tools"]) for r in provider.requests] == [1, 1, 1]


async def test_a_call_in_the_final_round_is_refused_and_the_run_ends(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = {
        "r": agent("REACT", toolConfig=tools("echo"), react={"systemPrompt": "A", "maxSteps": 1})
    }
    provider.enqueue(call_turn(("c1", "echo", "{}")), call_turn(("c2", "echo", "{}")))
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        events = await gateway.query("r", "Loop")
    assert kinds(events) == HEAD + CALL * 2 + ["run.complete"]
    assert "no more tool calls" in result_of(events[-2])
    assert events[-1].run_complete.finish_reason == "tool_calls"


async def test_an_answer_without_tools_ends_at_once(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = {"r": agent("REACT", toolConfig=tools("echo"))}
    provider.enqueue(answer_turn("Hi"))
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        events = await gateway.query("r", "Hello")
    assert kinds(events) == HEAD + ANSWER
    assert len(provider.requests) == 1
