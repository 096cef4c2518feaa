"""The AG-UI endpoint: agw runs as AG-UI event streams, through the real transports.

The whole service runs on loopback (gRPC server, HTTP adapter, a loopback model
provider); the tests post `RunAgentInput`s over HTTP and read the SSE answer.
Every event is validated against the `ag-ui-protocol` package's types (no field
the protocol does not describe), and the sequences are asserted exactly.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ag_ui.core import Event, RunAgentInput
from agw.v1 import gateway_pb2 as gw
from pydantic import TypeAdapter

from service.providers import loopback as lb
from service.providers.loopback import LoopbackProvider
from service.testing import Harness, write_agent
from tests.core.modes.test_plan_execute import THINKER, add_tasks, report
from tests.core.tools.kit import Probe, agent, answer_turn, call_turn, tools, write_ui_tools

EVENT = TypeAdapter(Event)
START = ["RUN_STARTED", "CUSTOM", "CUSTOM", "CUSTOM"]  # request.query, chat.start, run.start
CALL = ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_ARGS", "TOOL_CALL_END"]
TEXT = ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"]
GATED = {"plan": {"systemPrompt": "Plan.", "approval": True}, "execute": {"systemPrompt": "Do."}}
AGENTS = {
    "oneshot": agent(modelConfig=THINKER),
    "react": agent("REACT", toolConfig=tools("echo", "forever")),
    "planner": agent("PLAN_EXECUTE", toolConfig=tools("echo")),
    "gated": agent("PLAN_EXECUTE", toolConfig=tools("echo"), planExecute=GATED),
    "planned_pick": agent("PLAN_EXECUTE", toolConfig=tools(frontends=("pick",))),
    "guarded": agent("REACT", toolConfig=tools("echo"), toolPermissions={"echo": "ASK"}),
    "boss": agent("REACT", toolConfig={"agents": ["helper"]}),
    "helper": agent("REACT", toolConfig=tools("echo"), description="Echoes."),
    "picker": agent(toolConfig=tools("echo", frontends=("pick",), actions=("theme",))),
    "copilot": agent("REACT", toolConfig=tools("echo"), clientTools=True),
}


@pytest.fixture
async def service(tmp_path: Path, provider: LoopbackProvider) -> AsyncIterator[Harness]:
    """The service with the test agents, the UI tools and the probe's backend tools."""
    agents_dir = tmp_path / "agents"
    for key, definition in AGENTS.items():
        write_agent(agents_dir, key, definition)
    async with Harness.start(
        agents_dir, provider, tools_dir=write_ui_tools(tmp_path / "tools"), tools_watch=False
    ) as harness:
        for tool in Probe().tools():
            harness.app.tools.register(tool)
        yield harness


@pytest.fixture
async def client(service: Harness) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=service.http_url, timeout=20.0) as http:
        yield http


def run_input(text: str = "Hello", thread_id: str = "", **extra: Any) -> dict[str, Any]:
    """A RunAgentInput with one user message, valid by the protocol's own types."""
    body = {
        "threadId": thread_id or str(uuid.uuid4()),
        "runId": str(uuid.uuid4()),
        "messages": [{"id": "m1", "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "state": {},
        "forwardedProps": {},
        **extra,
    }
    RunAgentInput.model_validate(body)
    return body


async def post(client: httpx.AsyncClient, agent_key: str, body: dict[str, Any]) -> list[dict]:
    """Post a run and read its AG-UI events, each checked against the protocol's types."""
    events: list[dict[str, Any]] = []
    headers = {"Accept": "text/event-stream"}
    async with client.stream("POST", f"/api/ag-ui/{agent_key}", json=body, headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(checked(json.loads(line[6:])))
    assert_run(events, body)
    return events


def checked(data: dict[str, Any]) -> dict[str, Any]:
    """`data` as a valid AG-UI event, with no field the protocol does not name."""
    event = EVENT.validate_python(data)
    assert not event.model_extra, (data["type"], event.model_extra)
    assert event.model_dump(mode="json", by_alias=True) == data
    return data


def assert_run(events: list[dict[str, Any]], body: dict[str, Any]) -> None:
    """One AG-UI run: RUN_STARTED first, exactly one terminal event, last."""
    assert events[0]["type"] == "RUN_STARTED"
    assert (events[0]["threadId"], events[0]["runId"]) == (body["threadId"], body["runId"])
    terminals = [e for e in events if e["type"] in ("RUN_FINISHED", "RUN_ERROR")]
    assert terminals == [events[-1]]
    if events[-1]["type"] == "RUN_FINISHED":
        assert (events[-1]["threadId"], events[-1]["runId"]) == (body["threadId"], body["runId"])


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


async def test_oneshot_reasoning_and_text(
    client: httpx.AsyncClient, provider: LoopbackProvider
) -> None:
    provider.enqueue(answer_turn("Hel", "lo", reasoning="Hmm"))
    body = run_input("Hi there", forwardedProps={"lang": "en"})
    events = await post(client, "oneshot", body)
    assert types(events) == [
        *START,
        "REASONING_START",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
        "REASONING_END",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    agw = events[0]["metadata"]["agw"]
    assert agw["chatId"] == body["threadId"]
    assert [(e["name"], e["value"].get("message")) for e in events[1:4]] == [
        ("request.query", "Hi there"),
        ("chat.start", None),
        ("run.start", None),
    ]
    assert events[1]["value"]["params"] == {"lang": "en"}
    reasoning_id, content_id = f"{agw['runId']}_r_1", f"{agw['runId']}_c_1"
    assert events[6] == {**events[6], "messageId": reasoning_id, "delta": "Hmm"}
    assert [e["delta"] for e in events[10:12]] == ["Hel", "lo"]
    assert {e["messageId"] for e in events[9:13]} == {content_id}
    assert events[-1]["usage"] == [{"inputTokens": 10, "outputTokens": 5, "totalTokens": 15}]
    assert "outcome" not in events[-1]


async def test_each_delta_is_sent_at_once(
    client: httpx.AsyncClient, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue(
        [lb.content("Hel"), lb.Gate(gate), lb.content("lo"), lb.finish("stop"), lb.DONE]
    )
    body = run_input()
    events: list[dict[str, Any]] = []
    async with client.stream("POST", "/api/ag-ui/oneshot", json=body) as response:
        lines = response.aiter_lines()
        async for line in lines:  # the first delta arrives while the model holds the second
            if line.startswith("data: "):
                events.append(checked(json.loads(line[6:])))
                if events[-1]["type"] == "TEXT_MESSAGE_CONTENT":
                    break
        gate.set()
        events += [
            checked(json.loads(line[6:])) async for line in lines if line.startswith("data: ")
        ]
    assert_run(events, body)
    assert [e.get("delta") for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"] == ["Hel", "lo"]


async def test_a_body_over_the_limit_is_refused(tmp_path: Path, provider: LoopbackProvider) -> None:
    write_agent(tmp_path / "agents", "oneshot", AGENTS["oneshot"])
    async with (
        Harness.start(tmp_path / "agents", provider, http_max_body_bytes=1024) as service,
        httpx.AsyncClient(base_url=service.http_url, timeout=20.0) as http,
    ):
        refused = await http.post("/api/ag-ui/oneshot", json=run_input("x" * 2000))
        assert refused.status_code == 413
        assert refused.json()["status"] == "RESOURCE_EXHAUSTED"


async def test_the_thread_is_the_chat(
    client: httpx.AsyncClient, provider: LoopbackProvider
) -> None:
    provider.enqueue(answer_turn("One"), answer_turn("Two"))
    first = run_input("First")
    earlier = await post(client, "oneshot", first)
    assert "MESSAGES_SNAPSHOT" not in types(earlier)  # a new thread has no history to send
    second = run_input("Second", thread_id=first["threadId"])
    second["messages"] = [
        first["messages"][0],
        {"id": "a1", "role": "assistant", "content": "One"},
        {"id": "m2", "role": "user", "content": [{"type": "text", "text": "Second"}]},
    ]
    events = await post(client, "oneshot", second)
    assert types(events)[:4] == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "CUSTOM", "CUSTOM"]
    assert events[3]["name"] == "run.start"  # no chat.start
    said = [m["content"] for m in provider.requests[1]["messages"] if m["role"] == "user"]
    assert said == ["First", "Second"]  # the chat's memory, not the client's copy
    # the thread as agw keeps it, with the ids its streams used, then the new message
    first_run = earlier[0]["metadata"]["agw"]["runId"]
    assert events[1]["messages"] == [
        {"id": "m1", "role": "user", "content": "First"},
        {"id": f"{first_run}_c_1", "role": "assistant", "content": "One"},
        {"id": "m2", "role": "user", "content": "Second"},
    ]


async def test_react_with_a_backend_tool(
    client: httpx.AsyncClient, provider: LoopbackProvider
) -> None:
    provider.enqueue(call_turn(("c1", "echo", '{"text":"a"}')), answer_turn("Echoed."))
    events = await post(client, "react", run_input("Echo a"))
    assert types(events) == [*START, *CALL, "TOOL_CALL_RESULT", *TEXT, "RUN_FINISHED"]
    start, result = events[4], events[8]
    assert (start["toolCallId"], start["toolCallName"]) == ("c1", "echo")
    assert "".join(e["delta"] for e in events[5:7]) == '{"text":"a"}'
    assert result == {
        **result,
        "toolCallId": "c1",
        "messageId": "c1_result",
        "role": "tool",
    }
    assert json.loads(result["content"]) == {"echo": "a", "taskId": ""}


async def test_plan_execute_as_state_and_steps(
    client: httpx.AsyncClient, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        add_tasks("p1", "Echo a"),
        call_turn(("c1", "echo", '{"text":"a"}')),
        report("u1", "task_1", "completed", "a echoed"),
    )
    body = run_input("Plan it", state={"page": "home"})
    events = await post(client, "planner", body)
    assert types(events) == [
        *START,
        *CALL,  # _plan_add_tasks_
        "STATE_SNAPSHOT",
        "TOOL_CALL_RESULT",
        "STEP_STARTED",
        "STATE_DELTA",
        *CALL,
        "TOOL_CALL_RESULT",
        *CALL,  # _plan_update_task_
        "TOOL_CALL_RESULT",
        "STEP_FINISHED",
        "STATE_DELTA",
        "RUN_FINISHED",
    ]
    snapshot = events[8]["snapshot"]
    assert snapshot["page"] == "home"
    tasks = snapshot["plan"]["tasks"]
    assert [(t["taskId"], t["description"], t["status"]) for t in tasks] == [
        ("task_1", "Echo a", "init")
    ]
    assert events[10] == {**events[10], "stepName": "task_1"}
    assert events[11]["delta"] == [
        {"op": "replace", "path": "/plan/tasks/0/status", "value": "in_progress"}
    ]
    assert events[-3] == {**events[-3], "type": "STEP_FINISHED", "stepName": "task_1"}
    assert events[-2]["delta"] == [
        {"op": "replace", "path": "/plan/tasks/0/status", "value": "completed"}
    ]


async def test_a_subagent_is_attributed(
    client: httpx.AsyncClient, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        call_turn(("h1", "helper", '{"task":"Echo x"}')),
        call_turn(("c1", "echo", '{"text":"x"}')),
        answer_turn("x echoed"),
        answer_turn("Done."),
    )
    events = await post(client, "boss", run_input("Echo x"))
    nested = ["SUBAGENT_STARTED", *CALL, "TOOL_CALL_RESULT", *TEXT, "SUBAGENT_FINISHED"]
    assert types(events) == [*START, *CALL, *nested, "TOOL_CALL_RESULT", *TEXT, "RUN_FINISHED"]
    started = events[8]
    assert started == {
        **started,
        "subagentRunId": "h1",
        "name": "helper",
        "parentToolCallId": "h1",
    }
    assert [e.get("subagentRunId") for e in events[9:17]] == ["h1"] * 8
    assert events[17] == {**events[17], "type": "SUBAGENT_FINISHED", "subagentRunId": "h1"}
    assert events[18] == {**events[18], "toolCallId": "h1", "content": "x echoed"}
    assert "subagentRunId" not in events[18]


async def test_a_plan_approval_is_an_interrupt(
    client: httpx.AsyncClient, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        add_tasks("p1", "Echo a"),
        call_turn(("c1", "echo", '{"text":"a"}')),
        report("u1", "task_1", "completed", "a echoed"),
    )
    first = run_input("Plan it")
    events = await post(client, "gated", first)
    assert types(events) == [
        *START,
        *CALL,
        "STATE_SNAPSHOT",
        "TOOL_CALL_RESULT",
        "CUSTOM",
        "RUN_FINISHED",
    ]
    (interrupt,) = events[-1]["outcome"]["interrupts"]
    assert interrupt["id"] == events[-2]["value"]["approvalId"]
    assert (interrupt["reason"], interrupt["responseSchema"]) == (
        "plan_approval",
        {"type": "boolean"},
    )
    assert interrupt["metadata"]["agw"]["plan"]["tasks"][0]["description"] == "Echo a"

    resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": True}]
    second = run_input(thread_id=first["threadId"], resume=resume)
    events = await post(client, "gated", second)
    assert types(events) == [
        "RUN_STARTED",
        "CUSTOM",  # request.submit
        "STEP_STARTED",
        "STATE_DELTA",
        *CALL,
        "TOOL_CALL_RESULT",
        *CALL,
        "TOOL_CALL_RESULT",
        "STEP_FINISHED",
        "STATE_DELTA",
        "RUN_FINISHED",
    ]


async def test_a_frontend_tool_in_a_plan_task(
    client: httpx.AsyncClient, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        add_tasks("p1", "Ask the user"),
        call_turn(("f1", "pick", '{"options":["a","b"]}')),
        report("u1", "task_1", "completed", "picked"),
    )
    first = run_input("Plan it")
    events = await post(client, "planned_pick", first)
    planned = [*CALL, "STATE_SNAPSHOT", "TOOL_CALL_RESULT", "STEP_STARTED", "STATE_DELTA"]
    assert types(events) == [*START, *planned, *CALL, "STEP_FINISHED", "RUN_FINISHED"]
    pick = events[12]["toolCallId"]
    assert events[-2]["stepName"] == "task_1"  # closed while the AG-UI run is away
    assert events[-1]["outcome"] == {"type": "success", "pendingToolCallIds": [pick]}

    second = run_input(thread_id=first["threadId"])
    second["messages"].append({"id": "r1", "role": "tool", "toolCallId": pick, "content": "b"})
    events = await post(client, "planned_pick", second)
    assert types(events) == [
        "RUN_STARTED",
        "STEP_STARTED",  # the task goes on
        "CUSTOM",  # request.submit
        *CALL,
        "TOOL_CALL_RESULT",
        "STEP_FINISHED",
        "STATE_DELTA",
        "RUN_FINISHED",
    ]
    assert events[1]["stepName"] == "task_1" and events[2]["value"]["payload"] == "b"


async def test_a_failed_run_ends_with_run_error(
    client: httpx.AsyncClient, provider: LoopbackProvider
) -> None:
    provider.enqueue([lb.content("Par"), lb.error_chunk("the model fell over")])
    events = await post(client, "oneshot", run_input())
    assert types(events) == [*START, *TEXT[:2], "TEXT_MESSAGE_END", "RUN_ERROR"]
    assert events[-1]["code"] == "PROVIDER_STREAM_ERROR"
    assert "the model fell over" in events[-1]["message"]


async def test_a_cancelled_run_finishes_cancelled(
    client: httpx.AsyncClient, provider: LoopbackProvider
) -> None:
    provider.enqueue(call_turn(("c1", "forever", "{}")))
    body = run_input("Wait")
    events: list[dict[str, Any]] = []
    async with client.stream("POST", "/api/ag-ui/react", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            events.append(checked(json.loads(line[6:])))
            if events[-1]["type"] == "TOOL_CALL_END":
                run_id = events[0]["metadata"]["agw"]["runId"]
                cancelled = await client.post("/api/cancel", json={"runId": run_id})
                assert cancelled.json()["data"]["cancelled"] is True
    assert_run(events, body)
    assert types(events) == [*START, *CALL, "RUN_FINISHED"]  # the call never had a result
    assert events[-1]["outcome"] == {"type": "cancelled"}


async def test_a_frontend_tool_round_trip(
    client: httpx.AsyncClient, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        call_turn(("f1", "pick", '{"options":["a","b"]}'), ("e1", "echo", '{"text":"x"}')),
        answer_turn("You picked ", "a."),
    )
    first = run_input("Pick one")
    events = await post(client, "picker", first)
    ends = ["TOOL_CALL_END", "TOOL_CALL_END", "TOOL_CALL_RESULT", "RUN_FINISHED"]
    assert types(events) == [*START, *CALL[:3], *CALL[:3], *ends]  # parallel calls
    pick = events[4]["toolCallId"]
    assert pick.startswith("t_") and events[4]["toolCallName"] == "pick"
    assert events[-2]["toolCallId"] == "e1"  # the backend call's result; pick waits
    assert events[-1]["outcome"] == {"type": "success", "pendingToolCallIds": [pick]}

    second = run_input(thread_id=first["threadId"])
    second["messages"] = [
        first["messages"][0],
        {
            "id": "a1",
            "role": "assistant",
            "toolCalls": [
                {"id": pick, "type": "function", "function": {"name": "pick", "arguments": "{}"}}
            ],
        },
        {"id": "r1", "role": "tool", "toolCallId": pick, "content": '"a"'},
    ]
    RunAgentInput.model_validate(second)
    events = await post(client, "picker", second)
    assert types(events) == ["RUN_STARTED", "CUSTOM", *TEXT[:2], *TEXT[1:], "RUN_FINISHED"]
    assert events[1]["name"] == "request.submit"
    assert events[1]["value"]["toolId"] == pick and events[1]["value"]["payload"] == "a"
    assert "outcome" not in events[-1]
    fed_back = provider.requests[1]["messages"]
    assert {m["tool_call_id"]: m["content"] for m in fed_back if m["role"] == "tool"}["f1"] == "a"


@pytest.mark.parametrize(("status", "allowed"), [("resolved", True), ("cancelled", False)])
async def test_a_permission_is_an_interrupt(
    client: httpx.AsyncClient, provider: LoopbackProvider, status: str, allowed: bool
) -> None:
    provider.enqueue(call_turn(("c1", "echo", '{"text":"a"}')), answer_turn("Done."))
    first = run_input("Echo a")
    events = await post(client, "guarded", first)
    assert types(events) == [*START, *CALL, "CUSTOM", "RUN_FINISHED"]
    asked = events[-2]["value"]
    assert events[-2]["name"] == "permission.ask"
    (interrupt,) = events[-1]["outcome"]["interrupts"]
    assert events[-1]["outcome"]["type"] == "interrupt"
    assert interrupt == {
        **interrupt,
        "id": asked["permissionId"],
        "reason": "permission",
        "toolCallId": "c1",
        "message": 'Allow the tool call echo({"text":"a"})?',
        "responseSchema": {"type": "boolean"},
    }
    assert interrupt["expiresAt"].endswith("Z")

    resume = [{"interruptId": interrupt["id"], "status": status, "payload": True}]
    second = run_input(thread_id=first["threadId"], resume=resume)
    second["messages"] = first["messages"]
    events = await post(client, "guarded", second)
    assert types(events) == [
        *START[:1],
        "CUSTOM",
        "CUSTOM",
        "TOOL_CALL_RESULT",
        *TEXT,
        "RUN_FINISHED",
    ]
    assert [e["name"] for e in events[1:3]] == ["request.submit", "permission.answer"]
    assert events[2]["value"].get("allowed", False) is allowed  # false fields are left out
    assert events[3]["content"].startswith("Error: the user refused") is not allowed


async def test_an_answer_after_the_wait_expired_is_refused(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    write_agent(tmp_path / "agents", "picker", agent(toolConfig=tools(frontends=("pick",))))
    provider.enqueue(
        call_turn(("f1", "pick", '{"options":["a","b"]}')), answer_turn("No answer came.")
    )
    async with (
        Harness.start(
            tmp_path / "agents",
            provider,
            tools_dir=write_ui_tools(tmp_path / "tools"),
            frontend_wait_timeout_s=0.2,
        ) as service,
        httpx.AsyncClient(base_url=service.http_url, timeout=20.0) as http,
    ):
        first = run_input("Pick one")
        events = await post(http, "picker", first)
        pick = events[-1]["outcome"]["pendingToolCallIds"][0]
        run = gw.AttachRequest(run_id=events[0]["metadata"]["agw"]["runId"])
        rest = [e.type async for e in service.stub.Attach(run)]  # the wait times out, the run ends
        assert rest[-1] == "run.complete"
        late = run_input(thread_id=first["threadId"])
        late["messages"].append({"id": "r1", "role": "tool", "toolCallId": pick, "content": "a"})
        refused = await http.post("/api/ag-ui/picker", json=late)
        assert refused.status_code == 400
        assert refused.json()["reason"] == "EXPIRED"
        assert f"'{pick}' cannot be answered: EXPIRED" in refused.json()["msg"]
        again = await http.post("/api/ag-ui/picker", json=late)  # nothing kept: the same answer
        assert (again.status_code, again.json()["reason"]) == (400, "EXPIRED")


async def test_refusals_answer_the_error_envelope(
    client: httpx.AsyncClient, service: Harness
) -> None:
    unknown = await client.post("/api/ag-ui/nope", json=run_input())
    assert unknown.status_code == 404 and unknown.json()["reason"] == "AGENT_NOT_FOUND"
    not_json = await client.post(
        "/api/ag-ui/oneshot",
        content=json.dumps(run_input()),
        headers={"Content-Type": "text/plain"},
    )
    assert not_json.status_code == 415
    foreign = await client.post(
        "/api/ag-ui/oneshot", json=run_input(), headers={"Origin": "https://evil.example"}
    )
    assert foreign.status_code == 403
    rebinding = await client.post(
        "/api/ag-ui/oneshot", json=run_input(), headers={"Host": "evil.example"}
    )
    assert rebinding.status_code == 421
    no_user = await client.post("/api/ag-ui/oneshot", json={**run_input(), "messages": []})
    assert no_user.status_code == 400 and "last message" in no_user.json()["msg"]
    stray = run_input()
    stray["messages"].append({"id": "r", "role": "tool", "toolCallId": "t_1", "content": "x"})
    answered_nothing = await client.post("/api/ag-ui/oneshot", json=stray)
    assert answered_nothing.status_code == 400
    assert "answers no pending tool call" in answered_nothing.json()["msg"]
    assert (
        await client.post("/api/ag-ui/oneshot", content=b"[1]", headers=JSON)
    ).status_code == 400


JSON = {"Content-Type": "application/json"}


async def test_the_credential_is_passed_on(tmp_path: Path, provider: LoopbackProvider) -> None:
    write_agent(tmp_path / "agents", "oneshot", AGENTS["oneshot"])
    keys = [{"key": "s3cret", "tenant": "acme", "subject": "ann"}]
    async with (
        Harness.start(tmp_path / "agents", provider, auth_api_keys=keys) as service,
        httpx.AsyncClient(base_url=service.http_url, timeout=20.0) as http,
    ):
        refused = await http.post("/api/ag-ui/oneshot", json=run_input())
        assert refused.status_code == 401 and refused.json()["reason"] == "UNAUTHENTICATED"
        provider.enqueue(answer_turn("Hi"))
        http.headers["Authorization"] = "Bearer s3cret"
        events = await post(http, "oneshot", run_input())
        assert types(events)[-1] == "RUN_FINISHED"
    await asyncio.sleep(0)


def nested(depth: int) -> Any:
    """An object nested `depth` levels: {"k": {"k": ... "bottom"}}."""
    value: Any = "bottom"
    for _ in range(depth):
        value = {"k": value}
    return value


@pytest.mark.parametrize("depth", [45, 80])
async def test_a_tool_result_nested_too_deep_is_refused(
    client: httpx.AsyncClient, provider: LoopbackProvider, depth: int
) -> None:
    """A result deeper than a Submit request may carry is a 400 with the envelope, not a 500,
    and the call still waits for a proper result."""
    provider.enqueue(call_turn(("f1", "pick", '{"options":["a","b"]}')), answer_turn("Fine."))
    first = run_input("Pick one")
    pick = (await post(client, "picker", first))[-1]["outcome"]["pendingToolCallIds"][0]
    second = run_input(thread_id=first["threadId"])
    result = {"id": "r1", "role": "tool", "toolCallId": pick, "content": json.dumps(nested(depth))}
    second["messages"].append(result)
    refused = await client.post("/api/ag-ui/picker", json=second)
    assert refused.status_code == 400, refused.text
    assert refused.json()["status"] == "INVALID_ARGUMENT"
    second["messages"][-1] = {**result, "content": '"a"'}
    assert types(await post(client, "picker", second))[-1] == "RUN_FINISHED"


async def test_a_resume_payload_nested_too_deep_is_refused(
    client: httpx.AsyncClient, provider: LoopbackProvider
) -> None:
    provider.enqueue(call_turn(("c1", "echo", '{"text":"a"}')), answer_turn("Done."))
    first = run_input("Echo a")
    (interrupt,) = (await post(client, "guarded", first))[-1]["outcome"]["interrupts"]
    entry = {"interruptId": interrupt["id"], "status": "resolved", "payload": nested(45)}
    second = run_input(thread_id=first["threadId"], resume=[entry])
    second["messages"] = first["messages"]
    refused = await client.post("/api/ag-ui/guarded", json=second)
    assert refused.status_code == 400, refused.text
    second["resume"] = [{**entry, "payload": True}]
    assert types(await post(client, "guarded", second))[-1] == "RUN_FINISHED"


MAP_TOOL = {
    "name": "show_map",
    "description": "Show a city on the map in the page.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


async def test_the_clients_own_tools_are_offered_and_answered_by_the_client(
    client: httpx.AsyncClient, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        call_turn(("c1", "show_map", '{"city":"Oslo"}')), answer_turn("The map shows Oslo.")
    )
    first = run_input("Where is Oslo?", tools=[MAP_TOOL])
    events = await post(client, "copilot", first)
    assert types(events) == [*START, *CALL, "RUN_FINISHED"]
    call = events[4]
    assert call["toolCallName"] == "show_map" and call["toolCallId"].startswith("t_")
    assert events[-1]["outcome"] == {"type": "success", "pendingToolCallIds": [call["toolCallId"]]}
    offered = provider.requests[0]["tools"]
    assert [t["function"]["name"] for t in offered] == ["echo", "show_map"]
    assert offered[1]["function"] == {
        "name": "show_map",
        "description": "Show a city on the map in the page.",
        "parameters": MAP_TOOL["parameters"],
    }
    # the client ran it: the next run answers it with a tool message, and the run goes on
    second = run_input("Where is Oslo?", thread_id=first["threadId"], tools=[MAP_TOOL])
    second["messages"] += [
        {
            "id": "a1",
            "role": "assistant",
            "toolCalls": [
                {
                    "id": call["toolCallId"],
                    "type": "function",
                    "function": {"name": "show_map", "arguments": '{"city":"Oslo"}'},
                }
            ],
        },
        {"id": "r1", "role": "tool", "toolCallId": call["toolCallId"], "content": '"shown"'},
    ]
    events = await post(client, "copilot", second)
    assert types(events) == ["RUN_STARTED", "CUSTOM", *TEXT, "RUN_FINISHED"]
    assert events[1]["name"] == "request.submit" and events[1]["value"]["payload"] == "shown"
    assert provider.requests[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "c1",
        "name": "show_map",
        "content": "shown",
    }


async def test_client_tools_for_an_agent_that_takes_none_are_refused(
    client: httpx.AsyncClient, provider: LoopbackProvider
) -> None:
    refused = await client.post("/api/ag-ui/react", json=run_input("Hi", tools=[MAP_TOOL]))
    assert refused.status_code == 400
    assert refused.json()["msg"] == (
        "agent 'react' does not take tools from the client (its file does not set "
        '"clientTools": true); send the query without tools'
    )
    bad = {**MAP_TOOL, "parameters": {"type": "array"}}
    refused = await client.post("/api/ag-ui/copilot", json=run_input("Hi", tools=[bad, bad]))
    assert refused.status_code == 400
    assert refused.json()["msg"] == (
        'tools[0].parameters.type: must be "object" (got "array"); tools[1].parameters.type: '
        'must be "object" (got "array"); tools[1].name: duplicate tool name \'show_map\' '
        "(see tools[0])"
    )
    taken = {**MAP_TOOL, "name": "echo"}
    refused = await client.post("/api/ag-ui/copilot", json=run_input("Hi", tools=[taken]))
    assert refused.json()["msg"] == (
        "tools[0].name: 'echo' is a tool agent 'copilot' has already; name the client's tool "
        "otherwise"
    )
    assert provider.requests == []
