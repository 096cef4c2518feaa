"""MCP tools in real queries: the test MCP server's process, the gRPC service, a loopback model.

The agents offer the server's tools with `toolConfig.mcp`; the model (a loopback
provider) calls them; each run describes the server once with `source.snapshot`
before its first turn that offers its tools, and GetChat replays it.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from agw.v1 import gateway_pb2 as gw

from service.core.chats.history import snapshot_form
from service.providers.loopback import LoopbackProvider
from tests.core.tools.kit import agent, answer_turn, assert_invariants, call_turn, kinds, result_of
from tests.toolsources.kit import (
    ANSWER,
    CALL,
    HEAD,
    MCP_TOOLS,
    comparable,
    eventually,
    http_server,
    mcp_gateway,
    offered,
    snapshots,
    stdio_server,
)
from tests.transport.test_query import error_info

AGENTS = {
    "helper": agent(toolConfig={"mcp": ["t"]}),
    "picky": agent(toolConfig={"backends": ["mcp__t__echo"]}),
    "stranger": agent(toolConfig={"mcp": ["nope"]}),
}


async def test_a_run_calls_an_mcp_tool_and_describes_the_server_once(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        call_turn(("call_1", "mcp__t__echo", '{"text": "hi"}')),
        call_turn(("call_2", "mcp__t__echo", '{"text": "again"}')),
        answer_turn("Said it twice."),
        answer_turn("Once more."),
    )
    async with mcp_gateway(tmp_path, provider, AGENTS, [stdio_server()]) as gateway:
        events = await gateway.query("helper", "Say hi")
        chat_id = events[0].chat_id
        second = await gateway.query("picky", "Anything?", chat_id=chat_id)
        await gateway.app.frontdoor.flush()
        reply = await gateway.stub.GetChat(gw.GetChatRequest(chat_id=chat_id))
        attached = [e async for e in gateway.stub.Attach(gw.AttachRequest(run_id=events[0].run_id))]

    assert kinds(events) == [*HEAD, "source.snapshot", *CALL, *CALL, *ANSWER]
    assert_invariants(events)
    assert snapshots(events) == [("mcp:t", "t", "", "")]
    start = events[4].tool_start
    assert (start.tool_id, start.tool_name, start.tool_type) == (
        "call_1",
        "mcp__t__echo",
        "backend",
    )
    assert start.description == "Say the text back."
    assert (result_of(events[8]), result_of(events[13])) == ("hi", "again")
    assert [offered(request) for request in provider.requests[:3]] == [MCP_TOOLS] * 3
    assert provider.requests[0]["tools"][0]["function"]["parameters"] == {
        "type": "object",
        "properties": {"text": {"title": "Text", "type": "string"}},
        "required": ["text"],
        "title": "echoArguments",
    }
    # Every run describes the sources it offers tools of, once (here by a tool's name).
    assert kinds(second) == ["request.query", "run.start", "source.snapshot", *ANSWER]
    assert offered(provider.requests[3]) == ["mcp__t__echo"]
    # History replays the snapshot form, the source included; Attach the whole stream.
    assert comparable(reply.events) == comparable(snapshot_form(events + second))
    assert [e.type for e in reply.events].count("source.snapshot") == 2
    assert comparable(attached) == comparable(events)


async def test_a_slow_tool_times_out_and_a_crashing_server_fails_only_its_call(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        call_turn(("call_s", "mcp__t__slow", '{"seconds": 30}')),
        call_turn(("call_c", "mcp__t__crash", "{}")),
        answer_turn("Both failed."),
        call_turn(("call_e", "mcp__t__echo", '{"text": "back"}')),
        answer_turn("It is back."),
    )
    server = stdio_server(timeout_s=0.5)
    async with mcp_gateway(tmp_path, provider, AGENTS, [server]) as gateway:
        events = await gateway.query("helper", "Try them")
        source = gateway.app.mcp[0]
        await eventually(lambda: source.connections == 2 and source.connected)
        after = await gateway.query("helper", "And now?")

    assert kinds(events) == [*HEAD, "source.snapshot", *CALL, *CALL, *ANSWER]
    assert_invariants(events)
    slow, crash = events[8].tool_result, events[13].tool_result
    assert (slow.error, result_of(events[8])) == (
        True,
        "Error: 'mcp__t__slow' timed out after 0.5 s",
    )
    assert (crash.error, result_of(events[13])) == (
        True,
        "Error: MCP server 't' closed the connection during the call",
    )
    assert events[-1].run_complete.finish_reason == "stop"
    # The server was started again: its tools are back for the next run.
    assert kinds(after) == [*HEAD, "source.snapshot", *CALL, *ANSWER]
    assert result_of(after[8]) == "back"


async def test_tools_the_server_adds_are_offered_from_the_next_turn(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        call_turn(("call_g", "mcp__t__grow", "{}")),
        call_turn(("call_x", "mcp__t__extra", '{"text": "new"}')),
        answer_turn("Grown."),
    )
    async with mcp_gateway(tmp_path, provider, AGENTS, [stdio_server()]) as gateway:
        events = await gateway.query("helper", "Grow")
        listed = [tool.name for tool in gateway.app.tools.list() if tool.name.startswith("mcp__")]

    assert kinds(events) == [*HEAD, "source.snapshot", *CALL, *CALL, *ANSWER]
    assert (result_of(events[8]), result_of(events[13])) == ("grown", "extra new")
    assert offered(provider.requests[0]) == MCP_TOOLS
    assert offered(provider.requests[1]) == [*MCP_TOOLS, "mcp__t__extra"]
    assert sorted(listed) == sorted([*MCP_TOOLS, "mcp__t__extra"])


async def test_a_server_that_cannot_start_is_reported_and_its_agents_run_without_it(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(answer_turn("No tools today."))
    down = {"name": "t", "command": str(tmp_path / "missing-server"), "reconnect_min_s": 30}
    async with mcp_gateway(tmp_path, provider, AGENTS, [down]) as gateway:
        events = await gateway.query("helper", "Anything?")
        errors = gateway.app.tools.errors
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await gateway.query("stranger", "Hello?")
        with pytest.raises(grpc.aio.AioRpcError) as unlisted:
            await gateway.query("picky", "Hello?")

    assert kinds(events) == HEAD + ANSWER
    assert "tools" not in provider.requests[0]
    assert errors == {
        "MCP server 't'": (
            f"MCP server 't': not connected (cannot start '{tmp_path / 'missing-server'}': "
            "No such file or directory)"
        )
    }
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(unknown.value).reason == "TOOL_NOT_FOUND"
    assert "mcp: 'nope' is not a configured MCP server" in (unknown.value.details() or "")
    assert "backends: 'mcp__t__echo' is not defined" in (unlisted.value.details() or "")


async def test_a_streamable_http_server_gets_its_headers_and_no_secret_leaks(
    tmp_path: Path,
    provider: LoopbackProvider,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    token = "tok-5ecret-value-42"
    monkeypatch.setenv("AGW_TEST_MCP_TOKEN", token)
    monkeypatch.setenv("AGW_TEST_MCP_WRONG", "wrong-5ecret-value-17")
    provider.enqueue(call_turn(("call_1", "t__echo", '{"text": "over http"}')), answer_turn("Ok."))
    caplog.set_level("DEBUG")
    async with http_server(REQUIRED_TOKEN=token) as url:
        servers = [
            {
                "name": "t",
                "transport": "http",
                "url": f"{url}?tenant=a",
                "headers": {"Authorization": "Bearer ${ENV:AGW_TEST_MCP_TOKEN}"},
                "tool_prefix": "t__",
                "title": "Test tools",
                "icon": "emoji:🧪",
                "connect_timeout_s": 60,
            },
            {
                "name": "w",
                "transport": "http",
                "url": url,
                "headers": {"Authorization": "Bearer ${ENV:AGW_TEST_MCP_WRONG}"},
                "reconnect_min_s": 30,
                "connect_timeout_s": 60,
            },
        ]
        agents = {"helper": agent(toolConfig={"mcp": ["t", "w"]})}
        async with mcp_gateway(tmp_path, provider, agents, servers) as gateway:
            events = await gateway.query("helper", "Echo over HTTP")
            errors = gateway.app.tools.errors

    assert kinds(events) == [*HEAD, "source.snapshot", *CALL, *ANSWER]
    assert snapshots(events) == [("mcp:t", "Test tools", url, "emoji:🧪")]
    assert result_of(events[8]) == "over http"
    assert offered(provider.requests[0]) == [name.replace("mcp__t__", "t__") for name in MCP_TOOLS]
    assert errors == {
        "MCP server 'w'": (
            "MCP server 'w': not connected (the server failed: Server returned an error response)"
        )
    }
    streamed = "".join(str(event) for event in events)
    for secret in (token, "wrong-5ecret-value-17"):
        assert secret not in streamed
        assert secret not in caplog.text
        assert secret not in str(errors)


async def test_cancelling_a_run_during_an_mcp_call_leaves_the_server_serving(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        call_turn(("call_s", "mcp__t__slow", '{"seconds": 30}')),
        call_turn(("call_e", "mcp__t__echo", '{"text": "still here"}')),
        answer_turn("Ok."),
    )
    async with mcp_gateway(tmp_path, provider, AGENTS, [stdio_server()]) as gateway:
        call = gateway.stub.Query(gw.QueryRequest(agent_key="helper", message="Wait"))
        events = []
        async for event in call:
            events.append(event)
            if event.type == "tool.end":
                await gateway.stub.Cancel(gw.CancelRequest(run_id=event.run_id))
        after = await gateway.query("helper", "Echo", chat_id=events[0].chat_id)
        source = gateway.app.mcp[0]
        assert (source.connections, source.connected) == (1, True)

    assert kinds(events) == [*HEAD, "source.snapshot", *CALL[:4], "run.cancel"]
    assert_invariants(events)
    assert kinds(after) == ["request.query", "run.start", "source.snapshot", *CALL, *ANSWER]
    assert result_of(after[7]) == "still here"


async def test_an_mcp_tools_progress_notifications_stream_as_tool_progress(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(call_turn(("call_p", "mcp__t__steps", '{"count": 2}')), answer_turn("Done."))
    async with mcp_gateway(tmp_path, provider, AGENTS, [stdio_server()]) as gateway:
        events = await gateway.query("helper", "Count")

    assert kinds(events) == [
        *HEAD,
        "source.snapshot",
        *CALL[:-1],
        "tool.progress",
        "tool.progress",
        "tool.progress",
        "tool.result",
        *ANSWER,
    ]
    assert_invariants(events)
    reports = [
        (p.tool_id, p.message, p.progress, p.total if p.HasField("total") else None, p.stream)
        for p in (e.tool_progress for e in events if e.type == "tool.progress")
    ]
    assert reports == [
        ("call_p", "step 1 of 2", 1.0, 2.0, "progress"),
        ("call_p", "step 2 of 2", 2.0, 2.0, "progress"),
        ("call_p", "", 3.0, None, "progress"),
    ]
    assert result_of(events[-5]) == "2 steps done"
