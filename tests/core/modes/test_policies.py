"""The run policies: toolPolicy, output REASONING_SUMMARY, verify SECOND_PASS_FIX, budgets."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from service.core.run.passes import SUMMARY_INSTRUCTION, VERIFY_INSTRUCTION
from service.providers.loopback import LoopbackProvider
from tests.core.tools.kit import (
    Probe,
    agent,
    answer_turn,
    assert_invariants,
    call_turn,
    kinds,
    tool_gateway,
    tools,
)

HEAD = ["request.query", "chat.start", "run.start"]
THINK = ["reasoning.start", "reasoning.delta", "reasoning.end"]
CALL = ["tool.start", "tool.args", "tool.args", "tool.end", "tool.result"]
ANSWER = ["content.start", "content.delta", "content.end", "run.complete"]
THINKER = {"reasoning": {"enabled": True, "effort": "LOW"}}


async def test_disallow_sends_no_tools(tmp_path: Path, provider: LoopbackProvider) -> None:
    agents = {"a": agent(toolConfig=tools("echo"), toolPolicy="DISALLOW")}
    provider.enqueue(answer_turn("No tools"))
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        events = await gateway.query("a", "hi")
    assert kinds(events) == HEAD + ANSWER
    assert "tools" not in provider.requests[0] and "tool_choice" not in provider.requests[0]


async def test_require_forces_a_tool_on_the_first_call_only(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = {"a": agent("REACT", toolConfig=tools("echo"), toolPolicy="REQUIRE")}
    provider.enqueue(call_turn(("c1", "echo", "{}")), answer_turn("Done"))
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        events = await gateway.query("a", "hi")
    assert kinds(events) == HEAD + CALL + ANSWER
    assert [r.get("tool_choice") for r in provider.requests] == ["required", None]


async def test_reasoning_summary_hides_raw_reasoning_and_streams_a_summary(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = {"a": agent(modelConfig=THINKER, output="REASONING_SUMMARY")}
    provider.enqueue(
        answer_turn("The answer", reasoning="secret chain of thought"),
        answer_turn("I weighed", " the options."),
    )
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        events = await gateway.query("a", "Why?")
    assert kinds(events) == [
        *HEAD,
        "content.start",
        "content.delta",
        "content.end",
        "reasoning.start",
        "reasoning.delta",
        "reasoning.delta",
        "reasoning.end",
        "run.complete",
    ]
    assert_invariants(events)
    run_id = events[0].run_id
    assert events[6].reasoning_start.reasoning_id == f"{run_id}_r_1"
    assert [e.reasoning_delta.delta for e in events[7:9]] == ["I weighed", " the options."]
    assert "secret" not in str(events)
    summary = provider.requests[1]
    assert summary["messages"] == [
        {"role": "system", "content": SUMMARY_INSTRUCTION},
        {"role": "user", "content": "secret chain of thought"},
    ]
    assert "reasoning_effort" not in summary and provider.requests[0]["reasoning_effort"] == "low"
    usage = events[-1].run_complete.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (20, 10)


async def test_second_pass_fix_keeps_the_candidate_internal_and_streams_the_check(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = {"a": agent(modelConfig=THINKER, verify="SECOND_PASS_FIX")}
    provider.enqueue(
        answer_turn("Draft with a mistake", reasoning="hm"),
        answer_turn("Fixed", " answer"),
    )
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        events = await gateway.query("a", "Question")
    assert kinds(events) == [
        *HEAD,
        *THINK,
        "content.start",
        "content.delta",
        "content.delta",
        "content.end",
        "run.complete",
    ]
    assert_invariants(events)
    assert [e.content_delta.delta for e in events[7:9]] == ["Fixed", " answer"]
    assert "mistake" not in str(events)
    check = provider.requests[1]
    assert check["messages"][-2:] == [
        {"role": "assistant", "content": "Draft with a mistake"},
        {"role": "user", "content": VERIFY_INSTRUCTION},
    ]
    assert "tools" not in check


@pytest.mark.parametrize(
    ("budget", "scripts", "tail", "limit"),
    [
        ("maxModelCalls", 2, CALL + CALL, "2"),
        ("maxToolCalls", 2, CALL + CALL[:4], "1"),
        ("maxSteps", 2, CALL + CALL[:4], "1"),
    ],
)
async def test_each_budget_ends_the_run_with_a_clear_error(
    tmp_path: Path,
    provider: LoopbackProvider,
    budget: str,
    scripts: int,
    tail: list[str],
    limit: str,
) -> None:
    agents = {"a": agent(toolConfig=tools("echo"), budget={budget: int(limit)})}
    provider.enqueue(*(call_turn((f"c{i}", "echo", "{}")) for i in range(scripts)))
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        events = await gateway.query("a", "Loop")
    assert kinds(events) == HEAD + tail + ["run.error"]
    assert_invariants(events)
    error = events[-1].run_error.error
    assert error.reason == "BUDGET_EXHAUSTED"
    assert (error.metadata["budget"], error.metadata["limit"]) == (budget, limit)
    assert budget in error.message
    assert len(provider.requests) == scripts


async def test_the_time_budget_cancels_a_running_tool(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    probe = Probe()
    agents = {"a": agent(toolConfig=tools("forever"), budget={"timeoutMs": 300})}
    provider.enqueue(call_turn(("c1", "forever", "{}")))
    async with tool_gateway(tmp_path, provider, agents, probe) as gateway:
        started = time.monotonic()
        events = await gateway.query("a", "Wait")
        elapsed = time.monotonic() - started
    assert kinds(events) == HEAD + CALL[:4] + ["run.error"]
    error = events[-1].run_error.error
    assert (error.reason, error.metadata["budget"]) == ("BUDGET_EXHAUSTED", "timeoutMs")
    assert probe.cancelled.is_set()
    assert 0.3 <= elapsed < 2.0
