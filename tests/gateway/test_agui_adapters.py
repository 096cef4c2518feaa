"""AG-UI continuations through another adapter process: nothing is kept between AG-UI runs.

Two HTTP adapters (as two processes would be: each its own gRPC channel) call
one service, or two replicas of it on one Redis; a thread's first AG-UI run
goes through one adapter, its continuations through the other.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from ag_ui.core import RunAgentInput

from service.gateway.server import HttpGateway
from service.providers.loopback import LoopbackProvider
from service.testing import Harness, write_agent
from tests.bus.conftest import started
from tests.core.tools.kit import agent, answer_turn, call_turn, tools, write_ui_tools
from tests.gateway.test_agui import CALL, START, TEXT, post, run_input, types

AGENTS = {
    "picker": agent(toolConfig=tools(frontends=("pick",))),
    "asker": agent("REACT", toolConfig=tools("ask_user")),
}
PICK = call_turn(("f1", "pick", '{"options":["a","b"]}'))


def ask(call_id: str, question: str) -> list[Any]:
    return call_turn((call_id, "ask_user", json.dumps({"question": question, "options": ["x"]})))


@asynccontextmanager
async def adapter(grpc_port: int) -> AsyncIterator[httpx.AsyncClient]:
    """One more HTTP adapter in front of the gRPC service on `grpc_port`, and its client."""
    gateway = HttpGateway(f"127.0.0.1:{grpc_port}")
    await gateway.start("127.0.0.1:0")
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{gateway.port}", timeout=20.0
        ) as client:
            yield client
    finally:
        await gateway.stop()


@asynccontextmanager
async def two_adapters(
    tmp_path: Path, provider: LoopbackProvider
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    agents_dir = tmp_path / "agents"
    for key, definition in AGENTS.items():
        write_agent(agents_dir, key, definition)
    async with (
        Harness.start(
            agents_dir, provider, tools_dir=write_ui_tools(tmp_path / "tools")
        ) as service,
        httpx.AsyncClient(base_url=service.http_url, timeout=20.0) as a,
        adapter(service.app.grpc.port) as b,
    ):
        yield a, b


def answering(first: dict[str, Any], pick: str) -> dict[str, Any]:
    """The next RunAgentInput of `first`'s thread: the messages ending with `pick`'s result."""
    body = run_input(thread_id=first["threadId"])
    call = {"id": pick, "type": "function", "function": {"name": "pick", "arguments": "{}"}}
    body["messages"] = [
        first["messages"][0],
        {"id": "a1", "role": "assistant", "toolCalls": [call]},
        {"id": "r1", "role": "tool", "toolCallId": pick, "content": '"a"'},
    ]
    RunAgentInput.model_validate(body)
    return body


async def round_trip(a: httpx.AsyncClient, b: httpx.AsyncClient, agent_key: str) -> None:
    """A frontend tool's call ends the AG-UI run on `a`; its result continues it on `b`."""
    first = run_input("Pick one")
    events = await post(a, agent_key, first)
    assert types(events) == [*START, *CALL, "RUN_FINISHED"]
    pick = events[4]["toolCallId"]
    assert events[-1]["outcome"] == {"type": "success", "pendingToolCallIds": [pick]}
    events = await post(b, agent_key, answering(first, pick))
    assert types(events) == ["RUN_STARTED", "CUSTOM", *TEXT, "RUN_FINISHED"]
    assert events[1]["name"] == "request.submit"
    assert events[1]["value"]["toolId"] == pick and events[1]["value"]["payload"] == "a"
    assert "outcome" not in events[-1]


async def test_a_frontend_tool_answered_through_another_adapter(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(PICK, answer_turn("You picked a."))
    async with two_adapters(tmp_path, provider) as (a, b):
        await round_trip(a, b, "picker")
    fed_back = provider.requests[1]["messages"][-1]
    assert (fed_back["tool_call_id"], fed_back["content"]) == ("f1", "a")


async def test_questions_answered_through_alternating_adapters(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(ask("q1", "First?"), ask("q2", "Second?"), answer_turn("Both answered."))
    async with two_adapters(tmp_path, provider) as (a, b):
        first = run_input("Ask me twice")
        events = await post(a, "asker", first)
        assert types(events) == [*START, *CALL, "CUSTOM", "RUN_FINISHED"]
        (q1,) = events[-1]["outcome"]["interrupts"]
        assert q1["message"] == "First?"

        resume = [{"interruptId": q1["id"], "status": "resolved", "payload": "x"}]
        second = run_input(thread_id=first["threadId"], resume=resume)
        events = await post(b, "asker", second)
        assert types(events) == [
            "RUN_STARTED",
            "CUSTOM",  # request.submit
            "CUSTOM",  # question.answer
            "TOOL_CALL_RESULT",
            *CALL,
            "CUSTOM",  # question.ask
            "RUN_FINISHED",
        ]
        assert [e["name"] for e in events if e["type"] == "CUSTOM"] == [
            "request.submit",
            "question.answer",
            "question.ask",
        ]
        (q2,) = events[-1]["outcome"]["interrupts"]
        assert q2["message"] == "Second?"

        resume = [{"interruptId": q2["id"], "status": "resolved", "payload": "x"}]
        third = run_input(thread_id=first["threadId"], resume=resume)
        events = await post(a, "asker", third)  # back on the first adapter
        assert types(events) == [
            "RUN_STARTED",
            "CUSTOM",
            "CUSTOM",
            "TOOL_CALL_RESULT",
            *TEXT,
            "RUN_FINISHED",
        ]
        stale = await a.post("/api/ag-ui/asker", json=second)  # q1 again: answered long ago
        assert stale.status_code == 400


async def test_a_frontend_tool_answered_through_the_adapter_of_another_replica(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    provider.enqueue(PICK, answer_turn("You picked a."))
    async with (
        started(tmp_path, provider, redis_url, ("A", "B")) as replicas,
        adapter(replicas["A"].port) as a,
        adapter(replicas["B"].port) as b,
    ):
        await round_trip(a, b, "ui")  # the bus's test agent with the frontend tool "pick"
