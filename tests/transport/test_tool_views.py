"""What a client needs to show tool calls, over gRPC: a frontend tool's view and answer
schema on `tool.start`, and the arguments a tool ran with once their templates were
rendered, on `tool.result` (live and in the history of GetChat)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agw.v1 import gateway_pb2 as gw
from google.protobuf import json_format

from service.testing import Harness
from tests.transport.test_submit_cancel import submit, until

ROOT = Path(__file__).resolve().parents[2]
VIEW = (ROOT / "tools" / "views" / "confirm_dialog.html").read_text()
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"choice": {"type": "string", "description": "The option the user chose."}},
    "required": ["choice"],
}


@pytest.fixture
async def demo(tmp_path: Path) -> AsyncIterator[Harness]:
    """The example agents and tools on the built-in demo model, without pauses."""
    async with Harness.start(
        ROOT / "agents",
        None,
        tools_dir=ROOT / "tools",
        data_dir=tmp_path / "data",
        demo_delay_ms=0,
    ) as harness:
        yield harness


async def test_a_frontend_tool_carries_its_view_and_answer_schema(demo: Harness) -> None:
    call = demo.stub.Query(gw.QueryRequest(agent_key="demo_frontend", message="Go?"))
    events: list = []
    end = await until(call, "tool.end", events)
    (start,) = [e.tool_start for e in events if e.type == "tool.start"]
    assert (start.tool_name, start.tool_type, start.view_html) == ("confirm_dialog", "html", VIEW)
    assert json_format.MessageToDict(start.answer_schema) == ANSWER_SCHEMA
    reply = await submit(demo, end.run_id, end.tool_end.tool_id, {"choice": "Yes"})
    assert reply.accepted
    events += [event async for event in call]
    (result,) = [e.tool_result for e in events if e.type == "tool.result"]
    assert result.rendered_arguments == ""  # no templates in its arguments


async def test_a_backend_tool_has_no_view(demo: Harness) -> None:
    events = await demo.query("demo_plan", "Time and weather in Paris")
    starts = [e.tool_start for e in events if e.type == "tool.start"]
    assert starts and all(not s.view_html and not s.HasField("answer_schema") for s in starts)


async def test_the_rendered_arguments_of_a_templated_call(demo: Harness) -> None:
    events = await demo.query("demo_plan", "Time and weather in Paris")
    names = {e.tool_start.tool_id: e.tool_start.tool_name for e in events if e.type == "tool.start"}
    args: dict[str, str] = {}
    for event in events:
        if event.type == "tool.args":
            args[event.tool_args.tool_id] = args.get(event.tool_args.tool_id, "") + (
                event.tool_args.delta
            )
    results = {e.tool_result.tool_id: e.tool_result for e in events if e.type == "tool.result"}
    (date_call,) = [i for i, n in names.items() if n == "city_datetime"]
    (weather,) = [i for i, n in names.items() if n == "mock_city_weather"]
    date = json_format.MessageToDict(results[date_call].result)["date"]
    assert json.loads(args[weather])["date"] == "{{city_datetime.date}}"
    assert json.loads(results[weather].rendered_arguments) == {
        **json.loads(args[weather]),
        "date": date,
    }
    assert results[date_call].rendered_arguments == ""

    chat = await demo.stub.GetChat(gw.GetChatRequest(chat_id=events[0].chat_id))
    kept = {e.tool_result.tool_id: e.tool_result for e in chat.events if e.type == "tool.result"}
    assert kept[weather].rendered_arguments == results[weather].rendered_arguments
    assert kept[date_call].rendered_arguments == ""
