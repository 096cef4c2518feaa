"""Anthropic's Messages API and Gemini's streamGenerateContent, replayed from real recordings.

Each recorded body (fixtures/, sources in its README) is played by the loopback server
event by event, through the whole service (gRPC on loopback): the run's exact event
sequence is checked against the recording (read here with the standard library only),
and a tool round trip checks that the request continuing the conversation gives back
what the API needs (the thinking block and its signature; the thought signature), as the
real client whose recording it is did.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from agw.v1 import gateway_pb2 as gw
from aiohttp import web
from google.protobuf import json_format

from service.assembly.config import ProviderSettings
from service.providers.loopback import LoopbackProvider
from service.testing import Harness, oneshot_agent, write_agent
from tests.providers.recordings import as_event, data_of, events, request_of

HEAD = ["request.query", "chat.start", "run.start"]
KEY = "sk-native-SECRET-31"


class Tools:
    """The HTTP endpoint of the agents' backend tools: a fixed answer per tool."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, Any]] = []
        app = web.Application()
        app.router.add_post("/{name}", self.answer)
        self.runner = web.AppRunner(app)
        self.url = ""

    async def answer(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.calls.append((name, await request.json()))
        return web.Response(text=self.answers[name])

    async def __aenter__(self) -> Tools:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()

    def write(self, directory: Path, schemas: dict[str, dict[str, Any]]) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        entries = [
            {
                "name": name,
                "description": f"The {name} tool.",
                "parameters": schema,
                "toolApi": f"{self.url}/{name}",
            }
            for name, schema in schemas.items()
        ]
        (directory / "api.backend").write_text(json.dumps({"tools": entries}))


@pytest.fixture
async def tools() -> AsyncIterator[Tools]:
    answers = {"get_temperature": "18°C", "get_country": "Mexico", "generate_topic": "cars"}
    async with Tools(answers) as endpoint:
        yield endpoint


def native(provider: LoopbackProvider, api: str, model: str) -> dict[str, ProviderSettings]:
    settings = ProviderSettings(
        api=api,  # type: ignore[arg-type]
        base_url=provider.url,
        api_key=KEY,  # type: ignore[arg-type]
        default_model=model,
        max_retries=0,
    )
    return {api: settings}


@pytest.fixture
def agents(tmp_path: Path) -> Path:
    directory = tmp_path / "agents"
    thinking = {"reasoning": {"enabled": True, "effort": "LOW"}}
    write_agent(directory, "thinker", oneshot_agent("Think first.", modelConfig=thinking))
    write_agent(directory, "plain", oneshot_agent("You are terse."))
    for name, tool in (("weather", "get_temperature"), ("atlas", "get_country")):
        write_agent(
            directory,
            name,
            oneshot_agent("Use the tool.", modelConfig=thinking, toolConfig={"backends": [tool]}),
        )
    write_agent(
        directory,
        "jokes",
        oneshot_agent("Tell three jokes.", toolConfig={"backends": ["generate_topic"]}),
    )
    return directory


def with_tools(
    agents: Path, provider: LoopbackProvider, api: str, model: str
) -> AbstractAsyncContextManager[Harness]:
    """A gateway whose one provider speaks `api`, with the tools written beside `agents`."""
    return Harness.start(
        agents,
        provider,
        providers=native(provider, api, model),
        default_provider=api,
        tools_dir=agents.parent / "tools",
    )


async def run(
    agents: Path, provider: LoopbackProvider, api: str, model: str, agent: str, message: str
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Run a query on a gateway whose one provider speaks `api`: its events and the chat's
    stored records."""
    async with Harness.start(
        agents, provider, providers=native(provider, api, model), default_provider=api
    ) as gateway:
        found = await gateway.query(agent, message)
        await gateway.app.frontdoor.flush()
        chat = await gateway.stub.GetChat(
            gw.GetChatRequest(chat_id=found[0].chat_id, include_raw_messages=True)
        )
    return found, [json_format.MessageToDict(m) for m in chat.raw_messages]


def kinds(found: list[Any]) -> list[str]:
    return [e.type for e in found]


def reasoned_answer(reasoning: list[str], text: list[str]) -> list[str]:
    """The events of a run streaming these reasoning deltas, then these text deltas."""
    return [
        *HEAD,
        "reasoning.start",
        *["reasoning.delta"] * len(reasoning),
        "reasoning.end",
        "content.start",
        *["content.delta"] * len(text),
        "content.end",
        "run.complete",
    ]


def deltas(found: list[Any], kind: str) -> list[str]:
    field = kind.replace(".", "_")
    return [getattr(e, field).delta for e in found if e.type == kind]


def assistant_messages(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        m
        for r in records
        if r.get("_type") == "step"
        for m in r["messages"]
        if m["role"] == "assistant"
    ]


# -- Anthropic ------------------------------------------------------------------------------


def anthropic_expectation(chunks: list[bytes]) -> tuple[list[str], list[str], list[str]]:
    """(thinking deltas, text deltas, tool argument fragments) a recording streamed."""
    thinking, text, args = [], [], []
    for event in data_of(chunks):
        delta = event.get("delta") or {}
        if event["type"] != "content_block_delta":
            continue
        if delta["type"] == "thinking_delta" and delta["thinking"]:
            thinking.append(delta["thinking"])
        elif delta["type"] == "text_delta" and delta["text"]:
            text.append(delta["text"])
        elif delta["type"] == "input_json_delta" and delta["partial_json"]:
            args.append(delta["partial_json"])
    return thinking, text, args


async def test_anthropic_thinking_then_text(agents: Path, provider: LoopbackProvider) -> None:
    chunks = events("anthropic_thinking_text.sse")
    provider.enqueue(chunks)
    found, records = await run(
        agents, provider, "anthropic", "claude-sonnet-4-0", "thinker", "How do I cross the street?"
    )
    thinking, text, _ = anthropic_expectation(chunks)
    assert kinds(found) == reasoned_answer(thinking, text)
    assert deltas(found, "reasoning.delta") == thinking
    assert deltas(found, "content.delta") == text
    complete = found[-1].run_complete
    assert complete.finish_reason == "stop"
    assert (complete.usage.prompt_tokens, complete.usage.completion_tokens) == (43, 282)
    # what was sent: the Messages API, its headers, thinking on with the LOW budget
    assert provider.request_targets == ["/v1/messages"]
    headers = provider.request_headers[0]
    assert (headers["x-api-key"], headers["anthropic-version"]) == (KEY, "2023-06-01")
    assert "authorization" not in headers
    body = provider.requests[0]
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert body["system"] == [{"type": "text", "text": "Think first."}]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "How do I cross the street?"}]}
    ]
    assert (body["stream"], body["max_tokens"], body["model"]) == (True, 8192, "claude-sonnet-4-0")
    # the thinking block and its signature are kept with the answer, never shown
    signature = next(
        e["delta"]["signature"]
        for e in data_of(chunks)
        if e.get("delta", {}).get("type") == "signature_delta"
    )
    answer = assistant_messages(records)[-1]
    assert answer["_signatures"] == [
        {
            "api": "anthropic",
            "type": "thinking",
            "thinking": "".join(thinking),
            "signature": signature,
        }
    ]
    assert all(signature not in e.SerializeToString().decode("latin-1") for e in found)


async def test_anthropic_redacted_thinking_is_kept_not_shown(
    agents: Path, provider: LoopbackProvider
) -> None:
    chunks = events("anthropic_redacted_thinking.sse")
    provider.enqueue(chunks)
    found, records = await run(agents, provider, "anthropic", "claude-sonnet-4-5", "thinker", "hi")
    _, text, _ = anthropic_expectation(chunks)
    assert kinds(found) == [
        *HEAD,
        "content.start",
        *["content.delta"] * len(text),
        "content.end",
        "run.complete",
    ]
    redacted = [
        e["content_block"]["data"]
        for e in data_of(chunks)
        if e["type"] == "content_block_start" and e["content_block"]["type"] == "redacted_thinking"
    ]
    assert len(redacted) == 2
    assert assistant_messages(records)[-1]["_signatures"] == [
        {"api": "anthropic", "type": "redacted_thinking", "data": data} for data in redacted
    ]


async def test_anthropic_tool_round_trip_gives_the_signed_thinking_back(
    agents: Path, provider: LoopbackProvider, tools: Tools
) -> None:
    tools.write(agents.parent / "tools", {"get_temperature": CITY})
    first, second = events("anthropic_tool_call.1.sse"), events("anthropic_tool_call.2.sse")
    provider.enqueue(first, second)
    async with with_tools(agents, provider, "anthropic", "claude-sonnet-4-5") as gateway:
        found = await gateway.query(
            "weather", "How warm is it in Utrecht? Use the tool, then answer."
        )
    thinking, _, args = anthropic_expectation(first)
    _, text, _ = anthropic_expectation(second)
    assert kinds(found) == [
        *HEAD,
        "source.snapshot",  # the HTTP tool's origin
        "reasoning.start",
        *["reasoning.delta"] * len(thinking),
        "reasoning.end",
        "tool.start",
        *["tool.args"] * len(args),
        "tool.end",
        "tool.result",
        "content.start",
        *["content.delta"] * len(text),
        "content.end",
        "run.complete",
    ]
    start = found[4 + len(thinking) + 2]
    assert (start.tool_start.tool_id, start.tool_start.tool_name) == (
        "toolu_01TUGHRCfso8VSw9ekt21nAR",
        "get_temperature",
    )
    assert deltas(found, "tool.args") == args
    assert deltas(found, "content.delta") == text
    assert tools.calls == [("get_temperature", {"city": "Utrecht"})]
    # The request continuing the conversation is the one the real client sent: the
    # assistant turn is the signed thinking block then the tool_use; then the result.
    recorded = request_of("anthropic_tool_call.2.request.json")["messages"]
    sent = provider.requests[1]["messages"]
    assert sent[1] == recorded[1]
    result = {k: v for k, v in recorded[2]["content"][0].items() if k != "is_error"}
    assert sent[2] == {"role": "user", "content": [result]}
    assert provider.requests[1]["thinking"] == {"type": "enabled", "budget_tokens": 1024}


async def test_anthropic_error_event_mid_stream(agents: Path, provider: LoopbackProvider) -> None:
    # The recorded stream up to its first thinking deltas, then the error event as the
    # streaming documentation shows it (fixtures/README.md).
    chunks = events("anthropic_thinking_text.sse")[:6]
    error = (FIXTURES_ERROR).encode()
    provider.enqueue([*chunks, error])
    found, _ = await run(agents, provider, "anthropic", "claude-sonnet-4-0", "thinker", "hi")
    thinking, _, _ = anthropic_expectation(chunks)
    assert kinds(found) == [
        *HEAD,
        "reasoning.start",
        *["reasoning.delta"] * len(thinking),
        "reasoning.end",
        "run.error",
    ]
    detail = found[-1].run_error.error
    assert (detail.reason, detail.message) == (
        "PROVIDER_STREAM_ERROR",
        "provider 'anthropic': stream error: overloaded_error: Overloaded",
    )


FIXTURES_ERROR = (
    'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", '
    '"message": "Overloaded"}}\n\n'
)
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


# -- Gemini ---------------------------------------------------------------------------------


def gemini_expectation(chunks: list[bytes]) -> tuple[list[str], list[str]]:
    """(thought deltas, text deltas): one of each kind per event at most."""
    thoughts, text = [], []
    for event in data_of(chunks):
        parts = event["candidates"][0]["content"].get("parts", [])
        thought = "".join(p["text"] for p in parts if p.get("thought") and p.get("text"))
        said = "".join(p["text"] for p in parts if not p.get("thought") and p.get("text"))
        if thought:
            thoughts.append(thought)
        if said:
            text.append(said)
    return thoughts, text


async def test_gemini_thoughts_then_text(agents: Path, provider: LoopbackProvider) -> None:
    chunks = events("gemini_thoughts.sse")
    provider.enqueue(chunks)
    found, records = await run(
        agents, provider, "gemini", "gemini-2.5-pro", "thinker", "How do I cross the street?"
    )
    thoughts, text = gemini_expectation(chunks)
    assert kinds(found) == reasoned_answer(thoughts, text)
    assert deltas(found, "reasoning.delta") == thoughts
    assert deltas(found, "content.delta") == text
    last = data_of(chunks)[-1]["usageMetadata"]
    usage = found[-1].run_complete.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        last["promptTokenCount"],
        last["candidatesTokenCount"] + last["thoughtsTokenCount"],
        last["totalTokenCount"],
    )
    assert found[-1].run_complete.finish_reason == "stop"
    assert provider.request_targets == ["/v1/models/gemini-2.5-pro:streamGenerateContent?alt=sse"]
    assert provider.request_headers[0]["x-goog-api-key"] == KEY
    body = provider.requests[0]
    assert body["generationConfig"] == {
        "thinkingConfig": {"includeThoughts": True, "thinkingBudget": 1024}
    }
    assert body["systemInstruction"] == {"parts": [{"text": "Think first."}]}
    assert body["contents"] == [{"role": "user", "parts": [{"text": "How do I cross the street?"}]}]
    signature = next(
        p["thoughtSignature"]
        for e in data_of(chunks)
        for p in e["candidates"][0]["content"]["parts"]
        if "thoughtSignature" in p
    )
    assert assistant_messages(records)[-1]["_signatures"] == [
        {"api": "gemini", "signature": signature}
    ]


async def test_gemini_tool_round_trip_gives_the_thought_signature_back(
    agents: Path, provider: LoopbackProvider, tools: Tools
) -> None:
    tools.write(agents.parent / "tools", {"get_country": {"type": "object", "properties": {}}})
    first, second = events("gemini_tool_call.1.sse"), events("gemini_tool_call.2.sse")
    provider.enqueue(first, second)
    async with with_tools(agents, provider, "gemini", "gemini-3-pro-preview") as gateway:
        found = await gateway.query(
            "atlas", "What is the capital of the user country? Call the tool"
        )
    _, text = gemini_expectation(second)
    call_id = "call_QUVVadTSNJ6_qtsPvN7J8Q0_0"  # made of the response id: the API gave none
    assert kinds(found) == [
        *HEAD,
        "source.snapshot",
        "tool.start",
        "tool.args",
        "tool.end",
        "tool.result",
        "content.start",
        *["content.delta"] * len(text),
        "content.end",
        "run.complete",
    ]
    assert (found[4].tool_start.tool_id, found[4].tool_start.tool_name) == (call_id, "get_country")
    assert found[5].tool_args.delta == "{}"
    assert deltas(found, "content.delta") == text
    # The continuing request gives the call back with its thought signature — the bytes
    # the real client sent (it wrote them URL-safe) — and the result as its response.
    recorded = request_of("gemini_tool_call.2.request.json")["contents"]
    model, answer = provider.requests[1]["contents"][1:3]
    call = model["parts"][0]
    assert model["role"] == "model" and len(model["parts"]) == 1
    assert call["functionCall"] == {"id": call_id, "name": "get_country", "args": {}}
    assert base64.b64decode(call["thoughtSignature"]) == base64.urlsafe_b64decode(
        recorded[1]["parts"][0]["thoughtSignature"]
    )
    assert answer == {
        "role": "user",
        "parts": [
            {
                "functionResponse": {
                    "id": call_id,
                    "name": "get_country",
                    "response": {"result": "Mexico"},
                }
            }
        ],
    }
    assert recorded[2]["parts"][0]["functionResponse"]["name"] == "get_country"


async def test_gemini_parallel_calls_in_one_event(
    agents: Path, provider: LoopbackProvider, tools: Tools
) -> None:
    # The recorded answer calling generate_topic three times in one event, then (another
    # recording's) text answer.
    tools.write(agents.parent / "tools", {"generate_topic": {"type": "object", "properties": {}}})
    provider.enqueue([as_event("gemini_parallel_calls.json")], events("gemini_tool_call.2.sse"))
    async with with_tools(agents, provider, "gemini", "gemini-3-flash-preview") as gateway:
        found = await gateway.query("jokes", "Tell me three jokes.")
    ids = [f"call_wOd8abGuO5rgz7IP5tLEGA_{n}" for n in range(3)]
    _, text = gemini_expectation(events("gemini_tool_call.2.sse"))
    assert kinds(found) == [
        *HEAD,
        "source.snapshot",
        *["tool.start", "tool.args"] * 3,  # the one event: three calls, whole
        *["tool.end"] * 3,
        "loop.detect",  # the same call three times: the service notices
        *["tool.result"] * 3,
        "content.start",
        *["content.delta"] * len(text),
        "content.end",
        "run.complete",
    ]
    assert [e.tool_start.tool_id for e in found if e.type == "tool.start"] == ids
    model = provider.requests[1]["contents"][-2]
    signed = json.loads((FIXTURES_DIR / "gemini_parallel_calls.json").read_text())
    first_signature = signed["candidates"][0]["content"]["parts"][0]["thoughtSignature"]
    # only the first call came with a signature; the others get none of their own
    assert [p.get("thoughtSignature") for p in model["parts"]] == [
        first_signature,
        "skip_thought_signature_validator",
        "skip_thought_signature_validator",
    ]
    assert [
        p["functionResponse"]["id"] for p in provider.requests[1]["contents"][-1]["parts"]
    ] == ids


async def test_gemini_safety_stop_is_a_content_filter_finish(
    agents: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue([as_event("gemini_safety_stop.json")])
    found, _ = await run(agents, provider, "gemini", "gemini-2.0-flash-exp", "plain", "hi")
    assert kinds(found) == [*HEAD, "run.complete"]
    assert found[-1].run_complete.finish_reason == "content_filter"
    assert found[-1].run_complete.usage.prompt_tokens == 2417


async def test_gemini_blocked_prompt_fails_the_run_naming_the_reason(
    agents: Path, provider: LoopbackProvider
) -> None:
    provider.enqueue([as_event("gemini_prompt_blocked.json")])
    found, _ = await run(agents, provider, "gemini", "gemini-2.5-flash", "plain", "hi")
    assert kinds(found) == [*HEAD, "run.error"]
    detail = found[-1].run_error.error
    assert (detail.reason, detail.message) == (
        "PROVIDER_ERROR",
        "provider 'gemini': the prompt was blocked (MODEL_ARMOR: The prompt violated Prompt "
        "Injection and Jailbreak filters.)",
    )


FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures"


async def test_chat_memory_gives_each_api_its_signatures_in_a_later_run(
    agents: Path, provider: LoopbackProvider
) -> None:
    chunks = events("anthropic_thinking_text.sse")
    provider.enqueue(chunks, events("anthropic_tool_call.2.sse"))
    async with Harness.start(
        agents,
        provider,
        providers=native(provider, "anthropic", "claude-sonnet-4-0"),
        default_provider="anthropic",
    ) as gateway:
        first = await gateway.query("thinker", "How do I cross the street?")
        await gateway.app.frontdoor.flush()
        second = await gateway.query("thinker", "And at night?", chat_id=first[0].chat_id)
    assert second[-1].type == "run.complete"
    thinking, text, _ = anthropic_expectation(chunks)
    signature = next(
        e["delta"]["signature"]
        for e in data_of(chunks)
        if e.get("delta", {}).get("type") == "signature_delta"
    )
    # the earlier answer goes back as its signed thinking block, then its text
    assert provider.requests[1]["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "".join(thinking), "signature": signature},
            {"type": "text", "text": "".join(text)},
        ],
    }
