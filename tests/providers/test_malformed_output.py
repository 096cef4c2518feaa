"""Malformed provider output ends a run with PROVIDER_ERROR, never INTERNAL.

Through the real transport (a Query over gRPC against a loopback provider), plus
a bounded Hypothesis fuzz of the chunk decoder itself.
"""

from __future__ import annotations

import json
from dataclasses import astuple
from pathlib import Path
from typing import Any

import pytest
from agw.v1 import gateway_pb2 as gw
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.assembly.config import ProviderSettings
from service.core.errors import ProviderError
from service.core.model import ModelDelta
from service.providers.loopback import DONE, LoopbackProvider, content, finish, usage
from service.providers.openai_wire import parse_chunk
from service.testing import FAKE_MODEL, FAKE_PROVIDER, Harness

INT_RANGE = "an integer from 0 to 2147483647"
COUNT_RANGE = "an integer from 0 to 9007199254740992"


def kinds(events: list[Any]) -> list[str]:
    return [e.type for e in events]


def choice(delta: Any = None, **fields: Any) -> dict[str, Any]:
    return {"index": 0, "delta": {} if delta is None else delta, **fields}


def chunk(*choices: Any, **fields: Any) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "choices": list(choices), **fields}


def call(**fields: Any) -> dict[str, Any]:
    return {"index": 0, "id": "call_1", "function": {"name": "f", "arguments": "{}"}, **fields}


C0 = "choices[0]"
TC = "choices[0].delta.tool_calls[0]"
USAGE_DETAILS = "usage.prompt_tokens_details"


def bad_call(**fields: Any) -> dict[str, Any]:
    return chunk(choice({"tool_calls": [call(**fields)]}))


MALFORMED = [
    pytest.param({"choices": "str"}, "choices is a string, expected a list", id="choices-a-string"),
    pytest.param(chunk("x"), f"{C0} is a string, expected an object", id="choice-a-string"),
    pytest.param(
        chunk(choice(index="0")),
        f"{C0}.index is a string, expected {INT_RANGE}",
        id="index-a-string",
    ),
    pytest.param(
        chunk(choice(index=-1)),
        f"{C0}.index is an integer (-1), expected {INT_RANGE}",
        id="index-negative",
    ),
    pytest.param(
        chunk(choice("hi")), f"{C0}.delta is a string, expected an object", id="delta-a-string"
    ),
    pytest.param(
        chunk(choice({"content": ["a"]})),
        f"{C0}.delta.content is a list, expected a string",
        id="content-a-list",
    ),
    pytest.param(
        chunk(choice(finish_reason=1)),
        f"{C0}.finish_reason is an integer (1), expected a string",
        id="finish-reason-an-int",
    ),
    pytest.param(
        chunk(choice({"tool_calls": {}})),
        f"{C0}.delta.tool_calls is an object, expected a list",
        id="tool-calls-an-object",
    ),
    pytest.param(
        chunk(choice({"tool_calls": [7]})),
        f"{TC} is an integer (7), expected an object",
        id="tool-call-an-int",
    ),
    pytest.param(
        bad_call(index=1.5),
        f"{TC}.index is a number (1.5), expected {INT_RANGE}",
        id="tool-index-float",
    ),
    pytest.param(
        bad_call(id=5), f"{TC}.id is an integer (5), expected a string", id="tool-id-an-int"
    ),
    pytest.param(
        bad_call(function="f"),
        f"{TC}.function is a string, expected an object",
        id="function-a-string",
    ),
    pytest.param(
        bad_call(function={"name": False}),
        f"{TC}.function.name is a boolean (False), expected a string",
        id="name-a-boolean",
    ),
    pytest.param(
        bad_call(function={"arguments": {"a": 1}}),
        f"{TC}.function.arguments is an object, expected a string",
        id="arguments-an-object",
    ),
    pytest.param(chunk(usage="x"), "usage is a string, expected an object", id="usage-a-string"),
    pytest.param(
        chunk(usage={"prompt_tokens": "12"}),
        f"usage.prompt_tokens is a string, expected {COUNT_RANGE}",
        id="count-a-string",
    ),
    pytest.param(
        chunk(usage={"completion_tokens": True}),
        f"usage.completion_tokens is a boolean (True), expected {COUNT_RANGE}",
        id="count-a-boolean",
    ),
    pytest.param(
        chunk(usage={"total_tokens": -3}),
        f"usage.total_tokens is an integer (-3), expected {COUNT_RANGE}",
        id="count-negative",
    ),
    pytest.param(
        chunk(usage={"prompt_tokens": 2**53 + 1}),
        f"usage.prompt_tokens is an integer (9007199254740993), expected {COUNT_RANGE}",
        id="count-too-large",
    ),
    pytest.param(
        chunk(usage={"completion_tokens_details": []}),
        "usage.completion_tokens_details is a list, expected an object",
        id="details-a-list",
    ),
    pytest.param(
        chunk(usage={"prompt_tokens_details": {"cached_tokens": 1.0}}),
        f"{USAGE_DETAILS}.cached_tokens is a number (1.0), expected {COUNT_RANGE}",
        id="count-a-float",
    ),
]


@pytest.mark.parametrize(("bad", "problem"), MALFORMED)
async def test_a_malformed_chunk_is_a_provider_error(
    gateway: Harness, provider: LoopbackProvider, bad: Any, problem: str
) -> None:
    provider.enqueue([content("partial"), bad, finish("stop"), DONE])
    events = await gateway.query("plain", "hi")
    assert kinds(events) == [
        "request.query",
        "chat.start",
        "run.start",
        "content.start",
        "content.delta",
        "content.end",
        "run.error",
    ]
    error = events[-1].run_error.error
    assert error.reason == "PROVIDER_ERROR"
    assert error.message == f"provider 'fake': malformed stream chunk: {problem}"
    assert dict(error.metadata) == {"provider": "fake"}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"data: [1, 2]\n\n", "unexpected stream payload: '[1, 2]'"),
        (b'data: "text"\n\n', "unexpected stream payload: '\"text\"'"),
        (b"data: " + b"[" * 5000 + b"\n\n", "invalid JSON in stream: '" + "[" * 200 + "…'"),
    ],
    ids=["a-list", "a-string", "nested-too-deeply"],
)
async def test_a_payload_that_is_not_a_chunk_is_a_provider_error(
    gateway: Harness, provider: LoopbackProvider, raw: bytes, message: str
) -> None:
    provider.enqueue([raw, finish("stop"), DONE])
    events = await gateway.query("plain", "hi")
    assert kinds(events) == ["request.query", "chat.start", "run.start", "run.error"]
    error = events[-1].run_error.error
    assert (error.reason, error.message) == ("PROVIDER_ERROR", f"provider 'fake': {message}")


async def test_lone_surrogates_become_replacement_characters_and_the_run_is_recorded(
    gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(
        [
            b'data: {"choices": [{"index": 0, "delta": {"reasoning_content": "x\\udc00"}}]}\n\n',
            b'data: {"choices": [{"index": 0, "delta": {"content": "a\\ud800b"}}]}\n\n',
            b'data: {"choices": [{"index": 0, "delta": {"content": " \\ud83d\\ude00"}}]}\n\n',
            finish("stop"),
            DONE,
        ]
    )
    events = await gateway.query("thinker", "hi")
    assert kinds(events) == [
        "request.query",
        "chat.start",
        "run.start",
        "reasoning.start",
        "reasoning.delta",
        "reasoning.end",
        "content.start",
        "content.delta",
        "content.delta",
        "content.end",
        "run.complete",
    ]
    assert events[4].reasoning_delta.delta == "x\ufffd"
    assert [e.content_delta.delta for e in events[7:9]] == ["a\ufffdb", " \U0001f600"]
    await gateway.app.frontdoor.flush()
    chat = await gateway.stub.GetChat(
        gw.GetChatRequest(chat_id=events[0].chat_id, include_raw_messages=True)
    )
    assert [e.type for e in chat.events] == [
        "request.query",
        "chat.start",
        "run.start",
        "reasoning.snapshot",
        "content.snapshot",
        "run.complete",
    ]
    assert chat.events[3].reasoning_snapshot.text == "x\ufffd"
    assert chat.events[4].content_snapshot.text == "a\ufffdb \U0001f600"
    raw = [json_format.MessageToDict(m) for m in chat.raw_messages]
    assert "a\ufffdb \U0001f600" in json.dumps(raw, ensure_ascii=False)


async def test_only_choice_zero_of_a_multi_choice_stream_is_relayed(
    agents_dir: Path, provider: LoopbackProvider
) -> None:
    def both(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
        return chunk(choice(second, index=1), choice(first))

    provider.enqueue(
        [
            chunk(choice({"content": "Zero"})),
            chunk(choice({"content": "One"}, index=1)),
            both({"content": " says"}, {"content": " talks"}),
            chunk(choice({"tool_calls": [call()]}, index=1)),
            chunk(choice(finish_reason="tool_calls", index=1)),
            chunk(choice({"content": " hi."}), choice({"content": "!"}, index=1)),
            chunk(choice(finish_reason="stop")),
            usage(5, 4),
            DONE,
        ]
    )
    fake = ProviderSettings(
        base_url=provider.url, default_model=FAKE_MODEL, max_retries=0, extra_body={"n": 2}
    )
    async with Harness.start(agents_dir, provider, providers={FAKE_PROVIDER: fake}) as gateway:
        events = await gateway.query("plain", "hi")
    assert provider.requests[0]["n"] == 2
    assert kinds(events) == [
        "request.query",
        "chat.start",
        "run.start",
        "content.start",
        "content.delta",
        "content.delta",
        "content.delta",
        "content.end",
        "run.complete",
    ]
    assert [e.content_delta.delta for e in events[4:7]] == ["Zero", " says", " hi."]
    assert events[-1].run_complete.finish_reason == "stop"


# -- fuzzing the chunk decoder ----------------------------------------------------------

_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
)
_json = st.recursive(
    _leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)


def _field(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a value of the right shape, sometimes anything."""
    return st.one_of(good, good, _json)


_function = st.fixed_dictionaries(
    {}, optional={"name": _field(st.text(max_size=5)), "arguments": _field(st.text(max_size=8))}
)
_call = st.fixed_dictionaries(
    {},
    optional={
        "index": _field(st.integers(0, 3)),
        "id": _field(st.text(max_size=5)),
        "type": _json,
        "function": _field(_function),
    },
)
_delta = st.fixed_dictionaries(
    {},
    optional={
        "role": _json,
        "content": _field(st.text(max_size=8)),
        "reasoning_content": _field(st.text(max_size=8)),
        "reasoning": _json,
        "tool_calls": _field(st.lists(_field(_call), max_size=3)),
    },
)
_choice = st.fixed_dictionaries(
    {},
    optional={
        "index": _field(st.integers(0, 2)),
        "delta": _field(_delta),
        "finish_reason": _field(st.sampled_from(["stop", "length", "tool_calls"])),
    },
)
_count = _field(st.integers(0, 10**6))
_usage = st.fixed_dictionaries(
    {},
    optional={
        "prompt_tokens": _count,
        "completion_tokens": _count,
        "total_tokens": _count,
        "completion_tokens_details": _field(
            st.fixed_dictionaries({}, optional={"reasoning_tokens": _count})
        ),
        "prompt_tokens_details": _field(
            st.fixed_dictionaries({}, optional={"cached_tokens": _count})
        ),
    },
)
_chunk = st.fixed_dictionaries(
    {},
    optional={
        "choices": _field(st.lists(_field(_choice), max_size=3)),
        "usage": _field(_usage),
        "error": _json,
    },
)


def _payload(value: Any) -> str:
    return json.dumps(value)


def _assert_well_formed(delta: ModelDelta | None) -> None:
    """What the decoder returns can be put in events and records as is."""
    if delta is None:
        return
    for text in (delta.content, delta.reasoning, delta.finish_reason):
        assert text is None or (isinstance(text, str) and text)
        if text:
            text.encode("utf-8")  # no lone surrogates
    for tc in delta.tool_calls:
        assert isinstance(tc.index, int) and not isinstance(tc.index, bool)
        assert 0 <= tc.index < 2**31
        assert tc.id is None or (isinstance(tc.id, str) and tc.id)
        assert tc.name is None or (isinstance(tc.name, str) and tc.name)
        assert isinstance(tc.arguments, str)
        for text in (tc.id or "", tc.name or "", tc.arguments):
            text.encode("utf-8")
    if delta.usage is not None:
        for value in astuple(delta.usage):
            assert isinstance(value, int) and not isinstance(value, bool)
            assert 0 <= value <= 2**62


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        _chunk.map(_payload),
        _json.map(_payload),
        st.text(max_size=40),
        st.binary(max_size=40).map(lambda b: b.decode("utf-8", "replace")),
        _chunk.map(_payload).map(lambda s: s.replace('"', '"\\ud800', 1)),
    )
)
def test_the_chunk_decoder_only_raises_provider_errors(data: str) -> None:
    try:
        delta = parse_chunk("fuzz", data)
    except ProviderError as exc:
        assert exc.reason in ("PROVIDER_ERROR", "PROVIDER_STREAM_ERROR")
        exc.message.encode("utf-8")  # fit for a run.error event
        assert exc.message.startswith("provider 'fuzz': ")
    else:
        _assert_well_formed(delta)
