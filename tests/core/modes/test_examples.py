"""Every shipped example agent runs end to end on the built-in demo model, with its tools.

The examples tell the demo what to do in `modelConfig.extraBody.demo.script`; a real
provider configured in its place never receives that script.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from datetime import date, timedelta
from pathlib import Path

import pytest
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from google.protobuf import json_format, struct_pb2

from service.core.chats.history import snapshot_form
from service.providers.demo_tools import demo_text
from service.providers.loopback import LoopbackProvider
from service.testing import Harness
from tests.core.tools.kit import answer_turn, assert_invariants, kinds, result_of

ROOT = Path(__file__).resolve().parents[3]
EXPECTED = {
    "demo_oneshot": {"reasoning.start", "content.start"},
    "demo_plain": {"content.start"},
    "demo_react": {"tool.result", "reasoning.start"},
    "demo_plan": {"plan.create", "task.start", "task.complete", "plan.update", "tool.result"},
    "demo_parallel": {"plan.create", "task.start", "task.complete", "reasoning.start"},
    "demo_replan": {"plan.create", "plan.revise", "task.complete"},
    "demo_verify": {"plan.create", "plan.revise", "task.complete"},
    "demo_frontend": {"request.submit", "tool.result"},
    "demo_action": {"action.param", "action.result"},
    "demo_escalate": {"plan.create", "task.start", "task.complete", "tool.result"},
    "demo_team": {"tool.result", "content.start"},
    "demo_researcher": {"tool.result", "content.start"},
    "demo_skills": {"tool.result", "content.start"},
    "demo_question": {"question.ask", "request.submit", "question.answer", "tool.result"},
    "demo_context": {"context.compress", "tool.result"},
    "demo_concierge": {"content.start"},
    "demo_copilot": {"content.start"},
    "demo_loop": {"loop.detect", "question.ask", "request.submit", "question.answer"},
    "demo_shell": {"tool.progress", "tool.result", "content.start"},
}


#: The example MCP server (examples/mcp/agw.toml configures it for `make run`).
CLOCK = {
    "name": "clock",
    "command": sys.executable,
    "args": [str(ROOT / "examples" / "mcp" / "clock_server.py")],
    "connect_timeout_s": 60,
}


@pytest.fixture
async def demo(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness.start(
        ROOT / "agents",
        None,
        tools_dir=ROOT / "tools",
        skills_dir=ROOT / "skills",
        demo_delay_ms=0,
        data_dir=tmp_path,
        bash_working_dir=tmp_path / "workspace",
        http_enabled=False,
    ) as harness:
        yield harness


@pytest.fixture
async def clock_demo(tmp_path: Path) -> AsyncIterator[Harness]:
    """The demo with the example MCP server configured, as examples/mcp/agw.toml does."""
    async with Harness.start(
        ROOT / "agents",
        None,
        tools_dir=ROOT / "tools",
        demo_delay_ms=0,
        data_dir=tmp_path,
        http_enabled=False,
        mcp_servers=[CLOCK],
    ) as harness:
        yield harness


async def test_the_examples_cover_every_mode_and_tool_kind(clock_demo: Harness) -> None:
    demo = clock_demo
    agents = demo.app.agents.list()
    assert {a.mode for a in agents} == {"ONESHOT", "REACT", "PLAN_EXECUTE"}
    kinds_used = set()
    for agent in agents:
        for stage in agent.stage_names:
            for tool in demo.app.tools.for_stage(agent.stage(stage), agent.tool_policy).ordinary:
                kinds_used.add(tool.kind)
    assert kinds_used == {"backend", "frontend", "action"}
    assert demo.app.tools.errors == {} and demo.app.agents.errors == {}


@pytest.mark.parametrize("key", sorted(EXPECTED))
async def test_an_example_agent_runs_on_the_demo_model(demo: Harness, key: str) -> None:
    call = demo.stub.Query(gw.QueryRequest(agent_key=key, message="Weather in Paris tomorrow?"))
    events = []
    async for event in call:
        events.append(event)
        if event.type == "tool.end" and event.tool_end.tool_id.startswith("t_"):
            reply = await demo.stub.Submit(
                gw.SubmitRequest(
                    run_id=event.run_id,
                    tool_id=event.tool_end.tool_id,
                    payload=struct_pb2.Value(string_value="Yes"),
                )
            )
            assert reply.accepted
        if event.type == "question.ask":
            reply = await demo.stub.Submit(
                gw.SubmitRequest(
                    run_id=event.run_id,
                    tool_id=event.question_ask.question_id,
                    payload=struct_pb2.Value(string_value=event.question_ask.options[0]),
                )
            )
            assert reply.accepted
    assert events[-1].type == "run.complete", events[-1]
    assert_invariants(events)
    assert EXPECTED[key] <= set(kinds(events))
    errors = [e for e in events if e.type == "tool.result" and e.tool_result.error]
    assert errors == []


def calls_of(events: list) -> list[tuple[str, dict]]:
    """(tool name, arguments) of each tool call of a run, in order."""
    names = {e.tool_start.tool_id: e.tool_start.tool_name for e in events if e.type == "tool.start"}
    arguments: dict[str, str] = {}
    for event in events:
        if event.type == "tool.args":
            tool_id = event.tool_args.tool_id
            arguments[tool_id] = arguments.get(tool_id, "") + event.tool_args.delta
    return [(names[tool_id], json.loads(text)) for tool_id, text in arguments.items()]


async def test_the_react_example_follows_its_script(demo: Harness) -> None:
    events = await demo.query("demo_react", "Weather in Lyon tomorrow?")
    assert [(name, args.get("city")) for name, args in calls_of(events)] == [
        ("city_datetime", "Lyon"),  # the city the user named
        ("mock_city_weather", "Lyon"),
    ]
    local, weather = [result_of(e) for e in events if e.type == "tool.result"]
    tomorrow = date.fromisoformat(local["date"]) + timedelta(days=1)
    assert weather["date"] == tomorrow.isoformat()
    answer = "".join(e.content_delta.delta for e in events if e.type == "content.delta")
    assert answer.startswith(demo_text("Here is what the tools found:\n- **Local time in Lyon**: "))
    assert f"- **Weather in Lyon** on {tomorrow.isoformat()}: " in answer


async def test_the_plan_example_runs_its_scripted_tasks(demo: Harness) -> None:
    events = await demo.query("demo_plan", "Plan a day in Lyon")
    assert [e.task_start.description for e in events if e.type == "task.start"] == [
        "Find the local date and time in Lyon",
        "Get the weather in Lyon on that date",
    ]
    ordinary = [(n, a) for n, a in calls_of(events) if not n.startswith("_plan_")]
    assert ordinary == [
        ("city_datetime", {"city": "Lyon"}),
        ("mock_city_weather", {"city": "Lyon", "date": "{{city_datetime.date}}"}),
    ]
    results = [result_of(e) for e in events if e.type == "tool.result"]
    local, weather = [r for r in results if isinstance(r, dict) and "city" in r]
    assert (weather["city"], weather["date"]) == ("Lyon", local["date"])
    completed = [e.task_complete.description for e in events if e.type == "task.complete"]
    assert completed[0].startswith("city: Lyon, timezone: Europe/Paris")
    assert completed[1].startswith(f"city: Lyon, date: {local['date']}, condition: ")
    blocks: dict[str, str] = {}
    for event in events:
        if event.type == "content.delta":
            blocks[event.content_delta.content_id] = (
                blocks.get(event.content_delta.content_id, "") + event.content_delta.delta
            )
    draft, answer = blocks.values()
    assert draft.startswith(demo_text("My plan:\n1. Find the local date and time in Lyon"))
    assert answer.startswith(demo_text("I looked up the local date and time in Lyon"))
    assert answer.endswith("The weather is demo data, not a real forecast.")


def comparable(events: list) -> list[dict]:
    out = []
    for event in events:
        data = json_format.MessageToDict(event)
        data.pop("seq", None)
        data.pop("timestamp", None)
        out.append(data)
    return out


async def test_the_parallel_example_runs_its_lookups_at_once_then_compares(
    demo: Harness,
) -> None:
    events = await demo.query("demo_parallel", "Compare Lyon and Oslo")
    assert events[-1].type == "run.complete"
    tasks = [(e.type, e.task_id) for e in events if e.type in ("task.start", "task.complete")]
    lookups = ["task_1", "task_2", "task_3", "task_4"]
    assert tasks[:4] == [("task.start", t) for t in lookups]  # all four before any ends
    assert sorted(tasks[4:8]) == [("task.complete", t) for t in lookups]
    assert tasks[8:] == [("task.start", "task_5"), ("task.complete", "task_5")]
    ordinary = sorted((n, a["city"]) for n, a in calls_of(events) if not n.startswith("_plan_"))
    assert ordinary == [
        ("city_datetime", "Lyon"),
        ("city_datetime", "Oslo"),
        ("mock_city_weather", "Lyon"),
        ("mock_city_weather", "Oslo"),
    ]
    planned = [e.task_start.description for e in events if e.type == "task.start"]
    assert planned[:2] == [
        "Find the local date and time in Lyon",
        "Find the local date and time in Oslo",
    ]
    await demo.app.frontdoor.flush()
    reply = await demo.stub.GetChat(gw.GetChatRequest(chat_id=events[0].chat_id))
    assert comparable(reply.events) == comparable(snapshot_form(events))


async def test_the_replan_example_revises_then_finishes_early(demo: Harness) -> None:
    events = await demo.query("demo_replan", "Weather in Paris tonight?")
    revisions = [e.plan_revise for e in events if e.type == "plan.revise"]
    assert [r.decision for r in revisions] == [pb.PLAN_DECISION_REVISE, pb.PLAN_DECISION_FINISH]
    final = [(t.task_id, t.status) for t in revisions[-1].plan.tasks]
    assert final == [
        ("task_1", pb.TASK_STATUS_COMPLETED),
        ("task_2", pb.TASK_STATUS_CANCELED),
        ("task_3", pb.TASK_STATUS_COMPLETED),
        ("task_4", pb.TASK_STATUS_CANCELED),
    ]
    results = [result_of(e) for e in events if e.type == "tool.result"]
    local, weather = [r for r in results if isinstance(r, dict) and "city" in r]
    assert weather["date"] == local["date"]
    assert events[-1].type == "run.complete"


async def test_the_verify_example_plans_a_second_round_then_passes(demo: Harness) -> None:
    events = await demo.query("demo_verify", "Weather in Vienna?")
    verdicts = [json.loads(a)["verdict"] for n, a in _raw_calls(events) if n == "_plan_verify_"]
    assert verdicts == ["needsMorePlanning", "pass"]
    [revise] = [e.plan_revise for e in events if e.type == "plan.revise"]
    assert revise.reason == "The request asks about the weather too: get it for the local date."
    assert [e.task_start.description for e in events if e.type == "task.start"] == [
        "Find the local date and time in Vienna",
        "Get the weather in Vienna on that date",
    ]
    assert events[-1].type == "run.complete"


def _raw_calls(events: list) -> list[tuple[str, str]]:
    """(tool name, arguments text) of each tool call of a run, in order."""
    names = {e.tool_start.tool_id: e.tool_start.tool_name for e in events if e.type == "tool.start"}
    arguments: dict[str, str] = {}
    for event in events:
        if event.type == "tool.args":
            tool_id = event.tool_args.tool_id
            arguments[tool_id] = arguments.get(tool_id, "") + event.tool_args.delta
    return [(names[tool_id], text) for tool_id, text in arguments.items()]


async def test_the_mcp_example_asks_the_example_mcp_server(clock_demo: Harness) -> None:
    events = await clock_demo.query("demo_mcp", "What time is it in Tokyo?")
    assert events[-1].type == "run.complete", events[-1]
    assert_invariants(events)
    described = [e.source_snapshot for e in events if e.type == "source.snapshot"]
    assert [(s.source_id, s.title) for s in described] == [("mcp:clock", "clock")]
    assert calls_of(events) == [
        ("mcp__clock__zones", {"contains": "Tokyo"}),
        ("mcp__clock__now", {"zone": "Asia/Tokyo"}),
    ]
    zones, local = [result_of(e) for e in events if e.type == "tool.result"]
    assert zones == "Asia/Tokyo"
    assert json.loads(local)["zone"] == "Asia/Tokyo"


async def test_the_escalating_example_plans_when_it_calls_plan_create(demo: Harness) -> None:
    events = await demo.query("demo_escalate", "Time and weather in Lisbon")
    names = [name for name, _ in calls_of(events)]
    assert names[:2] == ["plan_create", "_plan_add_tasks_"]
    assert [e.task_start.description for e in events if e.type == "task.start"] == [
        "Find the local date and time in Lisbon",
        "Get the weather in Lisbon on that date",
    ]
    planned = await demo.query(
        "demo_escalate", "Time and weather in Paris", mode=gw.AGENT_MODE_PLAN_EXECUTE
    )
    names = [name for name, _ in calls_of(planned)]
    assert names[:1] == ["_plan_add_tasks_"] and "plan_create" not in names


async def test_the_team_example_streams_its_researchers_run_inside_its_own(demo: Harness) -> None:
    events = await demo.query("demo_team", "Weather in Paris tomorrow?")
    [call] = [e for e in events if e.type == "tool.start" and not e.parent_tool_id]
    assert call.tool_start.tool_name == "demo_researcher"
    nested = [e for e in events if e.parent_tool_id == call.tool_start.tool_id]
    assert [e.tool_start.tool_name for e in nested if e.type == "tool.start"] == [
        "city_datetime",
        "mock_city_weather",
    ]
    [report] = [e for e in events if e.type == "tool.result" and not e.parent_tool_id]
    assert str(result_of(report)).startswith(
        demo_text("Here is what the tools found:\n- **Local time in Paris**: ")
    )


async def test_the_skills_example_loads_its_skill(demo: Harness) -> None:
    events = await demo.query("demo_skills", "Notes for Paris")
    skill = next(e for e in events if e.type == "tool.result")
    assert str(result_of(skill)).startswith("# Trip notes\n\nWrite the notes in three short parts")


async def test_a_configured_provider_does_not_get_the_demo_script(tmp_path: Path) -> None:
    settings = {"tools_dir": ROOT / "tools", "data_dir": tmp_path, "http_enabled": False}
    async with (
        LoopbackProvider() as provider,
        Harness.start(ROOT / "agents", provider, **settings) as gateway,
    ):
        provider.enqueue(answer_turn("Nice."))
        events = await gateway.query("demo_react", "Weather in Paris?")
    assert events[-1].type == "run.complete"
    [body] = provider.requests
    assert "script" not in body and "demo" not in body


async def test_the_context_example_prunes_then_summarises_and_reuses_the_summary(
    demo: Harness,
) -> None:
    chat_id, strategies, runs = "", [], []
    for n in range(1, 5):
        events = await demo.query("demo_context", f"Weather in Paris, day {n}?", chat_id=chat_id)
        assert events[-1].type == "run.complete", events[-1]
        assert_invariants(events)
        chat_id = events[0].chat_id
        runs.append(events[0].run_id)
        strategies.append(
            [e.context_compress.strategy for e in events if e.context_compress.strategy]
        )
    assert strategies == [
        ["prune_tool_outputs"],
        ["prune_tool_outputs"],
        ["summarize"],
        ["summarize"],
    ]
    await demo.app.frontdoor.flush()
    records = await demo.app.frontdoor.lifecycle.chats.read(chat_id)
    summaries = [(r["runId"], r["summary"]) for r in records if "summary" in r]
    assert [(run, summary["through"]) for run, summary in summaries] == [
        (runs[2], runs[0]),  # the third run summarised the first
        (runs[3], runs[1]),  # the fourth folded that summary and the second run into one
    ]
    assert summaries[0][1]["text"] == "Earlier, the user said: “Weather in Paris, day 1?”."
    reply = await demo.stub.GetChat(gw.GetChatRequest(chat_id=chat_id))
    replayed = [e.context_compress.strategy for e in reply.events if e.type == "context.compress"]
    assert replayed == [s for run in strategies for s in run]


async def test_the_loop_example_caches_then_stops_when_told(demo: Harness) -> None:
    call = demo.stub.Query(gw.QueryRequest(agent_key="demo_loop", message="Paris?"))
    events = []
    async for event in call:
        events.append(event)
        if event.type == "question.ask":
            await demo.stub.Submit(
                gw.SubmitRequest(
                    run_id=event.run_id,
                    tool_id=event.question_ask.question_id,
                    payload=struct_pb2.Value(string_value="stop"),
                )
            )
    assert_invariants(events)
    results = [e.tool_result for e in events if e.type == "tool.result"]
    assert [(r.cached, r.error) for r in results] == [(False, False), (True, False), (False, True)]
    assert events[-1].run_complete.finish_reason == "loop_stopped"
