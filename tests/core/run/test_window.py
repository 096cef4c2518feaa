"""Context management through the gRPC transport: summarising, pruning, cached calls, loops.

Each run's exact event sequence, its requests to the (loopback) provider, and its
replay by GetChat and Attach, which must equal what the live stream showed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from google.protobuf import json_format, struct_pb2

from service.core.chats.history import snapshot_form
from service.core.chats.memory import remembered
from service.core.run.transcript import SUMMARY_HEADING, estimate_tokens, summary_message
from service.core.run.window import (
    SUMMARY_PROMPT,
    SUMMARY_SCHEMA,
    context_length,
    pruned_note,
    schema_tokens,
    transcript,
)
from service.core.tools.definitions import ToolDefinition
from service.core.tools.names import CONTEXT_SUMMARY_TOOL
from service.core.tools.registry import BackendTool, ToolCallInfo
from service.providers import loopback as lb
from service.providers.loopback import HttpError, LoopbackProvider
from service.testing import Harness
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
NEXT = ["request.query", "run.start"]  # a later run of the same chat
CALL = ["tool.start", "tool.args", "tool.args", "tool.end"]
ANSWER = ["content.start", "content.delta", "content.end"]
LONG_A, LONG_B = " ".join(["aaa"] * 30), " ".join(["bbb"] * 30)  # ~30 tokens each


def summary_turn(text: str) -> list[lb.ScriptItem]:
    """The model's answer to a summary call: the summary tool called with `text`."""
    arguments = json.dumps({"summary": text})
    return call_turn(("s1", CONTEXT_SUMMARY_TOOL, arguments))


def comparable(events: list[pb.Event]) -> list[dict[str, Any]]:
    out = []
    for event in events:
        data = json_format.MessageToDict(event)
        data.pop("seq", None)
        data.pop("timestamp", None)
        out.append(data)
    return out


def prompt_tokens(request: dict[str, Any]) -> int:
    """The estimate of a sent request's prompt: its messages and its tool schemas."""
    return estimate_tokens(request["messages"]) + schema_tokens(request.get("tools", []))


async def assert_replayed(gateway: Harness, live: list[pb.Event]) -> None:
    """GetChat shows the run as its live stream did; Attach replays it, whole or from mid-run."""
    await gateway.app.frontdoor.flush()
    chat = await gateway.stub.GetChat(gw.GetChatRequest(chat_id=live[0].chat_id))
    history = [e for e in chat.events if e.run_id == live[0].run_id]
    assert comparable(history) == comparable(snapshot_form(live))
    for after in (0, len(live) // 2):
        request = gw.AttachRequest(run_id=live[0].run_id, after_seq=after)
        attached = [e async for e in gateway.stub.Attach(request)]
        assert attached == live[after:]


async def ask(
    gateway: Harness, key: str, message: str, chat_id: str = "", **fields: Any
) -> list[pb.Event]:
    events = await gateway.query(key, message, chat_id=chat_id, **fields)
    assert_invariants(events)
    return events


# -- the context length ----------------------------------------------------------------


def test_the_context_length_is_configured_else_known_by_name_else_the_default() -> None:
    assert context_length(5000, "gpt-4o", 1) == 5000
    assert context_length(None, "gpt-4o-mini", 1) == 128_000
    assert context_length(None, "gpt-4.1-nano", 1) == 1_047_576  # the longest prefix wins
    assert context_length(None, "llama3.1:8b", 1) == 131_072
    assert context_length(None, "some-local-model", 4096) == 4096


def test_a_persisted_summary_stands_for_every_run_up_to_the_one_it_covers() -> None:
    def run(run_id: str, text: str, **extra: Any) -> list[dict[str, Any]]:
        user = {"role": "user", "content": [{"type": "text", "text": text}]}
        answer = {"role": "assistant", "content": [{"type": "text", "text": text.upper()}]}
        step = {"_type": "step", "runId": run_id, "messages": [user, answer], **extra}
        return [{"_type": "query", "runId": run_id}, step]

    records = run("r1", "one") + run("r2", "two") + run("r3", "three")
    records += run("r4", "four", summary={"text": "S", "through": "r2"})
    turns = remembered(records, 20)
    assert [(t.run_id, t.through) for t in turns] == [("", "r2"), ("r3", ""), ("r4", "")]
    assert turns[0].messages == [summary_message("S")]
    assert [t.run_id for t in remembered(records, 1)] == ["", "r4"]  # k counts runs after it
    assert [t.run_id for t in remembered(records[:6], 20)] == ["r1", "r2", "r3"]


# -- summarising the oldest turns ------------------------------------------------------


def summarising_agent(**context: Any) -> dict[str, Any]:
    return agent(
        "ONESHOT",
        modelConfig={"contextLength": 100},
        context={"compressAt": 0.9, "keepTurns": 1, **context},
    )


async def two_runs(gateway: Harness, provider: LoopbackProvider) -> tuple[str, str]:
    """Two runs with long answers, no compression yet; the chat's id and the first run's."""
    provider.enqueue(answer_turn(LONG_A), answer_turn(LONG_B))
    first = await ask(gateway, "s", "first question")
    second = await ask(gateway, "s", "second question", first[0].chat_id)
    assert "context.compress" not in kinds(first) + kinds(second)
    return first[0].chat_id, first[0].run_id


async def test_the_oldest_turns_are_summarised_once_and_the_summary_is_reused(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    async with tool_gateway(tmp_path, provider, {"s": summarising_agent()}) as gateway:
        chat_id, first_run = await two_runs(gateway, provider)
        provider.enqueue(summary_turn("The user asked a first question."), answer_turn("C"))
        third = await ask(gateway, "s", "third question", chat_id)
        assert kinds(third) == [*NEXT, "context.compress", *ANSWER, "run.complete"]
        compress = third[2].context_compress
        summary_call, answer_call = provider.requests[2], provider.requests[3]
        assert summary_call["tools"] == [SUMMARY_SCHEMA]
        assert summary_call["tool_choice"] == "required"
        assert summary_call["messages"] == [
            {"role": "system", "content": SUMMARY_PROMPT},
            {"role": "user", "content": f"user: first question\nassistant: {LONG_A}"},
        ]
        sent = answer_call["messages"]
        assert [m["role"] for m in sent] == ["system", "user", "user", "assistant", "user"]
        assert sent[1]["content"] == f"{SUMMARY_HEADING}\nThe user asked a first question."
        assert sent[3]["content"] == LONG_B
        assert (compress.strategy, compress.messages_before, compress.messages_after) == (
            "summarize",
            6,
            5,
        )
        assert compress.tokens_after == prompt_tokens(answer_call) < compress.tokens_before
        assert third[-1].run_complete.usage.total_tokens == 30  # the summary call counts
        await assert_replayed(gateway, third)

        provider.enqueue(answer_turn("D"))  # the next run starts from the stored summary
        fourth = await ask(gateway, "s", "fourth question", chat_id)
        assert kinds(fourth) == [*NEXT, *ANSWER, "run.complete"]
        assert len(provider.requests) == 5
        sent = provider.requests[4]["messages"]
        assert sent[1]["content"] == f"{SUMMARY_HEADING}\nThe user asked a first question."
        assert [m["content"] for m in sent[2:]] == [
            "second question",
            LONG_B,
            "third question",
            "C",
            "fourth question",
        ]
        records = await gateway.app.frontdoor.lifecycle.chats.read(chat_id)
        summaries = [(r["runId"], r["summary"]) for r in records if "summary" in r]
        text = "The user asked a first question."
        assert summaries == [(third[0].run_id, {"text": text, "through": first_run})]


async def test_a_failed_summary_call_falls_back_to_trimming(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    async with tool_gateway(tmp_path, provider, {"s": summarising_agent()}) as gateway:
        chat_id, _ = await two_runs(gateway, provider)
        provider.enqueue([HttpError(500, {"error": {"message": "down"}})], answer_turn("C"))
        third = await ask(gateway, "s", "third question", chat_id)
        assert kinds(third) == [*NEXT, "context.compress", *ANSWER, "run.complete"]
        compress = third[2].context_compress
        assert (compress.strategy, compress.messages_before, compress.messages_after) == (
            "truncate",
            6,
            4,
        )
        sent = provider.requests[3]["messages"]
        assert [m["content"] for m in sent[1:]] == ["second question", LONG_B, "third question"]
        assert compress.tokens_after == prompt_tokens(provider.requests[3])
        await assert_replayed(gateway, third)
        records = await gateway.app.frontdoor.lifecycle.chats.read(chat_id)
        assert not any("summary" in r for r in records)  # nothing to reuse: trimmed again later


async def test_the_summary_call_streams_nothing_but_its_debug_events(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    async with tool_gateway(tmp_path, provider, {"s": summarising_agent()}) as gateway:
        chat_id, _ = await two_runs(gateway, provider)
        provider.enqueue(summary_turn("Earlier: a first question."), answer_turn("C"))
        third = await ask(
            gateway, "s", "third question", chat_id, debug_level=gw.DEBUG_LEVEL_STANDARD
        )
        shown = [k for k in kinds(third) if k != "usage.update"]
        assert shown == [
            *NEXT,
            "model.start",
            "model.end",
            "context.compress",
            "model.start",
            *ANSWER,
            "model.end",
            "run.complete",
        ]
        assert [e.model_start.stage for e in third if e.type == "model.start"] == [
            "context",
            "oneshot",
        ]


# -- pruning old tool outputs ----------------------------------------------------------


async def test_old_tool_outputs_of_a_long_run_are_pruned_in_the_prompt_only(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    pruner = agent(
        "REACT",
        modelConfig={"contextLength": 1000},
        context={"pruneAt": 0.2, "keepToolOutputs": 1},
        toolConfig=tools("echo"),
    )
    first, second = json.dumps({"text": "a" * 400}), json.dumps({"text": "b" * 400})
    provider.enqueue(
        call_turn(("c1", "echo", first)), call_turn(("c2", "echo", second)), answer_turn("Done.")
    )
    async with tool_gateway(tmp_path, provider, {"p": pruner}) as gateway:
        events = await ask(gateway, "p", "Echo twice")
        assert kinds(events) == [
            *HEAD,
            *CALL,
            "tool.result",
            *CALL,
            "tool.result",
            "context.compress",
            *ANSWER,
            "run.complete",
        ]
        compress = events[13].context_compress
        assert compress.strategy == "prune_tool_outputs"
        assert compress.messages_before == compress.messages_after == 6
        outputs = [m for m in provider.requests[2]["messages"] if m["role"] == "tool"]
        full = json.dumps({"echo": "a" * 400, "taskId": ""}, ensure_ascii=False)
        assert outputs[0]["content"] == pruned_note("echo", len(full))
        assert json.loads(outputs[1]["content"])["echo"] == "b" * 400  # the newest one is kept
        assert compress.tokens_after == prompt_tokens(provider.requests[2])
        assert result_of(events[7]) == {"echo": "a" * 400, "taskId": ""}  # the event keeps it
        await assert_replayed(gateway, events)


# -- cached identical calls ------------------------------------------------------------


class Lookup:
    """A cacheable test tool that counts its executions."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, arguments: dict[str, Any], call: ToolCallInfo) -> dict[str, Any]:
        self.calls += 1
        return {"found": arguments.get("text", ""), "n": self.calls}

    def tool(self) -> BackendTool:
        definition = ToolDefinition(
            name="lookup",
            kind="backend",
            description="Look a text up (read-only).",
            parameters={"type": "object", "properties": {"text": {"type": "string"}}},
            cacheable=True,
        )
        return BackendTool(definition, self)


def repeating(*names: str) -> list[list[lb.ScriptItem]]:
    """Three turns calling each of `names` with the same arguments, then an answer."""
    same = '{"text": "x"}'
    turns = [call_turn(*[(f"c{i}{n}", n, same) for n in names]) for i in range(3)]
    return [*turns, answer_turn("Done.")]


async def test_an_identical_cacheable_call_gets_the_earlier_result_before_the_loop_refusal(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    lookup = Lookup()
    provider.enqueue(*repeating("lookup"))
    agents = {"r": agent("REACT", toolConfig=tools("lookup"))}
    async with tool_gateway(tmp_path, provider, agents) as gateway:
        gateway.app.tools.register(lookup.tool())
        events = await ask(gateway, "r", "Look it up")
        assert kinds(events) == [
            *HEAD,
            *CALL,
            "tool.result",
            *CALL,
            "tool.result",
            *CALL,
            "loop.detect",
            "tool.result",
            *ANSWER,
            "run.complete",
        ]
        results = [e.tool_result for e in events if e.type == "tool.result"]
        assert [(r.cached, r.error) for r in results] == [
            (False, False),
            (True, False),
            (False, True),
        ]
        assert result_of(events[7]) == result_of(events[12]) == {"found": "x", "n": 1}
        assert lookup.calls == 1
        await assert_replayed(gateway, events)  # GetChat keeps the cached flag


async def test_tools_not_declared_cacheable_run_every_time(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    probe = Probe()
    provider.enqueue(*repeating("echo")[:2], answer_turn("Done."))
    agents = {"r": agent("REACT", toolConfig=tools("echo"))}
    async with tool_gateway(tmp_path, provider, agents, probe) as gateway:
        events = await ask(gateway, "r", "Echo it")
    results = [e.tool_result for e in events if e.type == "tool.result"]
    assert [(r.cached, r.error) for r in results] == [(False, False), (False, False)]
    assert probe.calls == [("echo", {"text": "x"}), ("echo", {"text": "x"})]


# -- asking the user at a loop ---------------------------------------------------------


async def answered(gateway: Harness, key: str, answer: str) -> list[pb.Event]:
    """A run whose loop question is answered with `answer` through Submit."""
    events = []
    async for event in gateway.stub.Query(gw.QueryRequest(agent_key=key, message="Echo")):
        events.append(event)
        if event.type == "question.ask":
            assert list(event.question_ask.options) == ["continue", "skip", "stop"]
            reply = await gateway.stub.Submit(
                gw.SubmitRequest(
                    run_id=event.run_id,
                    tool_id=event.question_ask.question_id,
                    payload=struct_pb2.Value(string_value=answer),
                )
            )
            assert reply.accepted
    assert_invariants(events)
    return events


ASKED = [*CALL, "loop.detect", "question.ask", "request.submit", "question.answer", "tool.result"]


@pytest.mark.parametrize(
    ("answer", "tail", "error", "executed"),
    [
        ("skip", [*ANSWER, "run.complete"], True, 2),
        ("continue", [*ANSWER, "run.complete"], False, 3),
        ("stop", ["run.complete"], True, 2),
    ],
)
async def test_a_loop_asks_the_user_to_stop_continue_or_skip(
    tmp_path: Path,
    provider: LoopbackProvider,
    answer: str,
    tail: list[str],
    error: bool,
    executed: int,
) -> None:
    probe = Probe()
    provider.enqueue(*repeating("echo"))
    agents = {"r": agent("REACT", toolConfig=tools("echo"), loopDetect={"ask": True})}
    async with tool_gateway(tmp_path, provider, agents, probe) as gateway:
        events = await answered(gateway, "r", answer)
        assert kinds(events) == [
            *HEAD,
            *CALL,
            "tool.result",
            *CALL,
            "tool.result",
            *ASKED,
            *tail,
        ]
        detect = next(e.loop_detect for e in events if e.type == "loop.detect")
        assert (detect.tool_name, detect.repeat_count) == ("echo", 3)
        answer_event = next(e.question_answer for e in events if e.type == "question.answer")
        assert json_format.MessageToDict(answer_event.answer) == answer
        last = [e.tool_result for e in events if e.type == "tool.result"][-1]
        assert last.error is error
        assert len(probe.calls) == executed
        finish = events[-1].run_complete.finish_reason
        assert finish == ("loop_stopped" if answer == "stop" else "stop")
        assert len(provider.requests) == (3 if answer == "stop" else 4)
        await assert_replayed(gateway, events)


def test_the_transcript_to_summarise_names_calls_and_results() -> None:
    text = transcript(
        [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"function": {"name": "w", "arguments": '{"c": 1}'}}],
            },
            {"role": "tool", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
        ]
    )
    assert text == (
        'user: Weather?\nassistant called w({"c": 1})\ntool result: sunny\nassistant: It is sunny.'
    )


async def test_a_loop_stopped_inside_a_plan_task_ends_the_run_cleanly(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    probe = Probe()
    plan = json.dumps({"tasks": [{"description": "Echo it"}, {"description": "Then more"}]})
    provider.enqueue(call_turn(("p1", "_plan_add_tasks_", plan)), *repeating("echo")[:3])
    definition = agent("PLAN_EXECUTE", toolConfig=tools("echo"), loopDetect={"ask": True})
    async with tool_gateway(tmp_path, provider, {"p": definition}, probe) as gateway:
        events = await answered(gateway, "p", "stop")
        assert kinds(events) == [
            *HEAD,
            *CALL,
            "plan.create",
            "tool.result",
            "task.start",
            "plan.update",
            *CALL,
            "tool.result",
            *CALL,
            "tool.result",
            *ASKED,
            "plan.update",
            "run.complete",
        ]
        assert [e.task_id for e in events[9:-1]] == ["task_1"] * len(events[9:-1])
        statuses = [t.status for t in events[-2].plan_update.plan.tasks]
        assert statuses == [pb.TASK_STATUS_CANCELED, pb.TASK_STATUS_INIT]  # not started
        assert "task.fail" not in kinds(events)  # a clean end the user chose
        assert events[-1].run_complete.finish_reason == "loop_stopped"
        assert result_of(events[-3])  # the stopped call's result says why
        assert [e.tool_result.error for e in events if e.type == "tool.result"][-1] is True
        assert len(probe.calls) == 2 and len(provider.requests) == 4
        await assert_replayed(gateway, events)


async def test_the_offered_tool_schemas_count_in_the_prompt_size(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    wordy = BackendTool(
        ToolDefinition(name="wordy", kind="backend", description="A tool. " * 90),
        Lookup(),
    )
    definition = agent(
        "ONESHOT",
        toolConfig=tools("wordy"),
        modelConfig={"contextLength": 200},
        context={"compressAt": 0.9, "keepTurns": 1},
    )
    async with tool_gateway(tmp_path, provider, {"w": definition}) as gateway:
        gateway.app.tools.register(wordy)
        provider.enqueue(answer_turn("A"), answer_turn("B"))
        first = await ask(gateway, "w", "first question")
        assert kinds(first) == [*HEAD, *ANSWER, "run.complete"]  # no older turn to drop
        second = await ask(gateway, "w", "second question", first[0].chat_id)
        # The messages alone (about 30 tokens) fit in 180; with the schema they do not.
        assert estimate_tokens(provider.requests[0]["messages"]) * 2 < 180
        assert schema_tokens(provider.requests[1]["tools"]) > 180
        assert kinds(second) == [*NEXT, "context.compress", *ANSWER, "run.complete"]
        compress = second[2].context_compress
        assert (compress.strategy, compress.messages_before, compress.messages_after) == (
            "truncate",
            4,
            2,
        )
        assert compress.tokens_after == prompt_tokens(provider.requests[1])
        assert [m["content"] for m in provider.requests[1]["messages"][1:]] == ["second question"]
        await assert_replayed(gateway, second)
