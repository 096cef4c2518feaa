"""The `_bash_` tool through a real Query: it works, and attacks stay contained meanwhile."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path

import pytest
from agw.v1 import gateway_pb2 as gw

from service.providers import loopback as lb
from service.providers.loopback import LoopbackProvider
from tests.core.tools.kit import agent, answer_turn, call_turn, result_of, tool_gateway, tools

FAKE_KEY = "sk-bash-test-0123456789-FAKE"


def bash_call(command: str) -> list:
    return call_turn(("call_b", "_bash_", json.dumps({"command": command})))


async def run_bash(tmp_path: Path, provider: LoopbackProvider, command: str, **settings):
    agents = {"sh": agent(toolConfig=tools("_bash_"))}
    provider.enqueue(bash_call(command), answer_turn("ok"))
    async with tool_gateway(
        tmp_path, provider, agents, bash_working_dir=tmp_path / "work", **settings
    ) as gateway:
        events = await gateway.query("sh", "run it")
    return next(str(result_of(e)) for e in events if e.type == "tool.result")


async def test_a_command_runs_in_the_working_directory(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    result = await run_bash(tmp_path, provider, "echo hi > note.txt && cat note.txt && pwd")
    assert "exit_code: 0" in result and "hi" in result
    assert (tmp_path / "work" / "note.txt").read_text() == "hi\n"
    # the model got the same result as the next turn's tool message
    tool_message = provider.requests[1]["messages"][-1]
    assert tool_message["role"] == "tool" and "hi" in tool_message["content"]


async def test_the_provider_key_in_the_gateway_environment_is_not_visible(
    tmp_path: Path, provider: LoopbackProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    result = await run_bash(
        tmp_path,
        provider,
        "env; cat /proc/self/environ; cat /proc/1/environ; echo $OPENAI_API_KEY",
    )
    assert FAKE_KEY not in result


async def test_a_fork_bomb_is_contained_while_another_query_keeps_streaming(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = {"sh": agent(toolConfig=tools("_bash_")), "talk": agent()}
    deltas = 60
    pace = 0.02

    def respond(body: dict) -> list:
        if body.get("tools") and len(body["messages"]) == 2:
            return bash_call(":(){ :|:& };:")
        if body.get("tools"):
            return answer_turn("contained")
        script: list = []
        for n in range(deltas):
            script += [lb.Pause(pace), lb.content(f"{n} ")]
        return [*script, lb.finish("stop"), lb.DONE]

    provider.responder = respond
    async with tool_gateway(
        tmp_path, provider, agents, bash_working_dir=tmp_path / "work", bash_timeout_s=3.0
    ) as gateway:
        arrivals: list[float] = []

        async def talk() -> list:
            out = []
            async for event in gateway.stub.Query(gw.QueryRequest(agent_key="talk", message="go")):
                out.append(event)
                if event.type == "content.delta":
                    arrivals.append(time.monotonic())
            return out

        bomb, chat = await asyncio.gather(gateway.query("sh", "bomb"), talk())
    result = next(str(result_of(e)) for e in bomb if e.type == "tool.result")
    assert result.startswith("exit_code:")  # the bomb's shell returned; its children died
    assert int(result.split("duration_ms: ")[1].split()[0]) < 3000 + 1000
    assert bomb[-1].type == "run.complete" and chat[-1].type == "run.complete"
    assert len(arrivals) == deltas
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert max(gaps) < 0.5, f"the other stream stalled for {max(gaps):.3f}s"
