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
from tests.builtins.kit import SLACK, TIMED, disk_usage, intervals_in, most_at_once
from tests.core.tools.kit import agent, answer_turn, call_turn, result_of, tool_gateway, tools
from tests.toolsources.kit import ANSWER, CALL, HEAD

FAKE_KEY = "sk-bash-test-0123456789-FAKE"


def bash_call(command: str) -> list:
    return call_turn(("call_b", "_bash_", json.dumps({"command": command})))


async def run_bash(tmp_path: Path, provider: LoopbackProvider, command: str, **settings):
    agents = {"sh": agent(toolConfig=tools("_bash_"))}
    provider.enqueue(bash_call(command), answer_turn("ok"))
    async with tool_gateway(
        tmp_path, provider, agents, bash_working_dir=tmp_path / "work", **settings
    ) as gateway:
        events = await gateway.query("sh", "run it", chat_id="c1")
    return next(str(result_of(e)) for e in events if e.type == "tool.result")


async def test_a_command_runs_in_its_chats_workspace(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    result = await run_bash(tmp_path, provider, "echo hi > note.txt && cat note.txt && pwd")
    workspace = (tmp_path / "work" / "chats" / "c1").resolve()
    assert result.startswith("exit_code: 0\n")
    assert f"stdout:\nhi\n{workspace}\nstderr:\n" in result
    assert (workspace / "note.txt").read_text() == "hi\n"
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


async def test_chats_see_neither_each_others_files_nor_names(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = {"sh": agent(toolConfig=tools("_bash_"))}
    chats = tmp_path / "work" / "chats"
    provider.enqueue(
        bash_call("echo mine > secret.txt"),
        answer_turn("ok"),
        bash_call(f"ls {chats}; cat {chats}/alice/secret.txt; ls ..; echo x > ../alice/planted"),
        answer_turn("ok"),
    )
    async with tool_gateway(
        tmp_path, provider, agents, bash_working_dir=tmp_path / "work"
    ) as gateway:
        await gateway.query("sh", "write", chat_id="alice")
        events = await gateway.query("sh", "read", chat_id="bob")
    result = next(str(result_of(e)) for e in events if e.type == "tool.result")
    assert "stdout:\nbob\nbob\nstderr:\n" in result
    assert "mine" not in result
    assert sorted(p.name for p in (chats / "alice").iterdir()) == ["secret.txt"]


async def test_the_quota_bounds_a_chats_workspace_through_a_query(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    quota = 4 * 1024 * 1024
    result = await run_bash(
        tmp_path,
        provider,
        "head -c 1G /dev/zero > big; for i in $(seq 20); do head -c 1M /dev/zero > f$i; done",
        bash_workspace_quota_bytes=quota,
    )
    assert "workspace: quota exceeded: the command's files went over the 4 MiB quota" in result
    assert "No space left on device" in result
    workspace = tmp_path / "work" / "chats" / "c1"
    assert list(workspace.iterdir()) == []
    assert disk_usage(workspace) <= quota + SLACK


async def test_parallel_calls_of_one_query_take_turns_in_its_workspace(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = {"sh": agent(toolConfig=tools("_bash_"))}
    calls = [(f"call_{n}", "_bash_", json.dumps({"command": f"{TIMED} # {n}"})) for n in range(3)]
    provider.enqueue(call_turn(*calls), answer_turn("ok"))
    async with tool_gateway(
        tmp_path, provider, agents, bash_working_dir=tmp_path / "work", bash_max_concurrent=3
    ) as gateway:
        events = await gateway.query("sh", "three at once", chat_id="c1")
    results = [str(result_of(e)) for e in events if e.type == "tool.result"]
    assert len(results) == 3 and all(r.startswith("exit_code: 0\n") for r in results)
    times = (tmp_path / "work" / "chats" / "c1" / "times").read_text()
    intervals = intervals_in(times)
    assert len(intervals) == 3  # nobody's lines were lost
    assert most_at_once(intervals) == 1


async def test_concurrent_queries_share_at_most_max_concurrent_sandboxes(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = {"sh": agent(toolConfig=tools("_bash_"))}

    def respond(body: dict) -> list:
        if body["messages"][-1]["role"] == "tool":
            return answer_turn("done")
        return bash_call(TIMED)

    provider.responder = respond
    chats = [f"q{n}" for n in range(5)]
    async with tool_gateway(
        tmp_path, provider, agents, bash_working_dir=tmp_path / "work", bash_max_concurrent=2
    ) as gateway:
        runs = await asyncio.gather(*(gateway.query("sh", "go", chat_id=c) for c in chats))
    assert [run[-1].type for run in runs] == ["run.complete"] * 5
    intervals = [
        interval
        for chat in chats
        for interval in intervals_in((tmp_path / "work" / "chats" / chat / "times").read_text())
    ]
    assert len(intervals) == 5
    assert most_at_once(intervals) == 2


async def test_a_commands_output_streams_as_tool_progress_and_stays_in_history(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    agents = {"sh": agent(toolConfig=tools("_bash_"))}
    command = "echo one; sleep 0.6; echo two >&2; sleep 0.2; printf 'thr\\xc3\\xa9e'"
    provider.enqueue(bash_call(command), answer_turn("ok"))
    async with tool_gateway(
        tmp_path, provider, agents, bash_working_dir=tmp_path / "work"
    ) as gateway:
        events = await gateway.query("sh", "run it", chat_id="c1")
        await gateway.app.frontdoor.flush()
        chat = await gateway.stub.GetChat(gw.GetChatRequest(chat_id="c1"))

    kinds = [e.type for e in events]
    assert kinds == [*HEAD, *CALL[:-1], *["tool.progress"] * 3, "tool.result", *ANSWER]
    progress = [e for e in events if e.type == "tool.progress"]
    assert [
        (p.tool_progress.tool_id, p.tool_progress.message, p.tool_progress.stream) for p in progress
    ] == [
        ("call_b", "one", "stdout"),
        ("call_b", "two", "stderr"),
        ("call_b", "thrée", "stdout"),
    ]
    assert not progress[0].tool_progress.HasField("progress")
    # each line is sent as it is printed, not when the command has ended
    assert progress[1].timestamp - progress[0].timestamp >= 500
    # the chat's history replays them where they streamed: after the call, before its result
    replayed = [e.type for e in chat.events if e.run_id == events[0].run_id]
    assert replayed == [
        "request.query",
        "chat.start",
        "run.start",
        "tool.snapshot",
        "tool.progress",
        "tool.progress",
        "tool.progress",
        "tool.result",
        "content.snapshot",
        "run.complete",
    ]
    assert [e.tool_progress.message for e in chat.events if e.type == "tool.progress"] == [
        "one",
        "two",
        "thrée",
    ]
