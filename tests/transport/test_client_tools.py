"""Tools a gRPC query declares (`QueryRequest.tools`): frontend tools of that run only,
answered through Submit, kept by a run that resumes; refused where the agent takes none."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from agw.v1 import gateway_pb2 as gw
from google.protobuf import struct_pb2

from service.providers.loopback import LoopbackProvider
from service.testing import Harness, write_agent
from tests.core.tools.kit import agent, answer_turn, assert_invariants, call_turn, kinds
from tests.toolsources.kit import ANSWER, CALL, HEAD

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def map_tool() -> gw.ClientTool:
    tool = gw.ClientTool(name="show_map", description="Show a city on the map.")
    tool.parameters.update(SCHEMA)
    return tool


@pytest.fixture
def agents(tmp_path: Path) -> Path:
    directory = tmp_path / "agents"
    write_agent(directory, "copilot", agent(clientTools=True))
    write_agent(directory, "plain", agent())
    return directory


async def read_until_waiting(call: grpc.aio.UnaryStreamCall) -> list:
    events = []
    async for event in call:
        events.append(event)
        if event.type == "tool.end":
            return events
    raise AssertionError(f"the run never waited: {kinds(events)}")


async def test_a_declared_tool_is_called_answered_and_only_for_its_run(
    agents: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        call_turn(("c1", "show_map", '{"city":"Oslo"}')),
        answer_turn("Shown."),
        answer_turn("No tools now."),
    )
    async with Harness.start(agents, provider, http_enabled=False) as gateway:
        request = gw.QueryRequest(agent_key="copilot", message="Map Oslo", tools=[map_tool()])
        call = gateway.stub.Query(request)
        events = await read_until_waiting(call)
        start = events[3].tool_start
        reply = await gateway.stub.Submit(
            gw.SubmitRequest(
                run_id=events[0].run_id,
                tool_id=start.tool_id,
                payload=struct_pb2.Value(string_value="shown"),
            )
        )
        events += [event async for event in call]
        later = await gateway.query("copilot", "Again", chat_id=events[0].chat_id)
    assert reply.accepted
    assert kinds(events) == [*HEAD, *CALL[:-1], "request.submit", "tool.result", *ANSWER]
    assert_invariants(events)
    assert (start.tool_name, start.tool_type, start.description) == (
        "show_map",
        "client",
        "Show a city on the map.",
    )
    assert start.tool_id.startswith("t_")
    assert provider.requests[0]["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "show_map",
                "description": "Show a city on the map.",
                "parameters": SCHEMA,
            },
        }
    ]
    assert later[-1].type == "run.complete" and "tools" not in provider.requests[2]


async def test_a_run_waiting_on_a_declared_tool_resumes_with_it(
    agents: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue(call_turn(("c1", "show_map", '{"city":"Oslo"}')), answer_turn("Shown."))
    async with Harness.start(agents, provider, http_enabled=False, shutdown_grace_s=0.1) as gw1:
        call = gw1.stub.Query(
            gw.QueryRequest(agent_key="copilot", message="Map Oslo", tools=[map_tool()])
        )
        events = await read_until_waiting(call)
        call.cancel()
    async with Harness.start(agents, provider, http_enabled=False) as gw2:
        run_id, tool_id = events[0].run_id, events[-1].tool_end.tool_id
        reply = await gw2.stub.Submit(
            gw.SubmitRequest(
                run_id=run_id, tool_id=tool_id, payload=struct_pb2.Value(string_value="ok")
            )
        )
        rest = [e async for e in gw2.stub.Attach(gw.AttachRequest(run_id=run_id))]
    assert reply.accepted
    assert rest[-1].type == "run.complete"
    assert [r["tools"][0]["function"]["name"] for r in provider.requests] == ["show_map"] * 2


@pytest.mark.parametrize(
    ("key", "tool", "message"),
    [
        (
            "plain",
            gw.ClientTool(name="show_map", description="Map."),
            "agent 'plain' does not take tools from the client (its file does not set "
            '"clientTools": true); send the query without tools',
        ),
        (
            "copilot",
            gw.ClientTool(name="show map", description=""),
            "tools[0].name: String should match pattern '^[A-Za-z0-9_-]{1,64}$'; "
            "tools[0].description: String should have at least 1 character",
        ),
        (
            "copilot",
            gw.ClientTool(name="_plan_add_tasks_", description="Mine."),
            "tools[0].name: '_plan_add_tasks_' is a tool agent 'copilot' has already; name the "
            "client's tool otherwise",
        ),
    ],
)
async def test_declared_tools_are_refused_with_what_is_wrong(
    agents: Path, provider: LoopbackProvider, key: str, tool: gw.ClientTool, message: str
) -> None:
    async with Harness.start(agents, provider, http_enabled=False) as gateway:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await gateway.query(key, "Hi", tools=[tool])
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == message
