"""Hostile AG-UI `RunAgentInput`s, as Hypothesis strategies, and the checks of the answers.

`inputs(service)` builds bodies that are valid (a user message on a new or
known thread), near-valid (tool messages or `resume` entries answering calls
and interrupts the fuzzing saw, maybe another user's or already answered) or
hostile: fields of the wrong types, huge strings, deep nesting, unknown roles,
threadIds that are no chat ids or another principal's chat, and raw bytes.
`check` checks an answer: never a 5xx; a refusal is the error envelope; a
stream is AG-UI events, `RUN_STARTED` first and one `RUN_FINISHED` or
`RUN_ERROR` last, every start with its end. `note` keeps the threads, pending
tool calls and interrupts a stream named, for later inputs to answer.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from hypothesis import strategies as st

from tests.fuzz.endpoints import CALLERS, Answer, to_json
from tests.fuzz.http_answers import HttpAnswer, check_envelope
from tests.fuzz.kit import FuzzService
from tests.fuzz.protos import deep_value, json_values, strings

#: The texts a user message says: the demo model calls tools for some.
TEXTS = ("Hi", "Please pick a colour", "What time is it in Paris?", "plan a trip", "echo hi")
ROLES = ("user", "assistant", "tool", "system", "developer", "reasoning", "activity", "USER", "")
#: Start and end event types, and the field naming what they open.
PAIRS = {
    "TEXT_MESSAGE_START": ("TEXT_MESSAGE_END", "messageId"),
    "TOOL_CALL_START": ("TOOL_CALL_END", "toolCallId"),
    "REASONING_START": ("REASONING_END", "messageId"),
    "REASONING_MESSAGE_START": ("REASONING_MESSAGE_END", "messageId"),
    "STEP_STARTED": ("STEP_FINISHED", "stepName"),
}
TERMINALS = frozenset({"RUN_FINISHED", "RUN_ERROR"})


def _one_in(n: int) -> st.SearchStrategy[bool]:
    """True one time in `n` (False first: the value Hypothesis starts and shrinks towards)."""
    return st.sampled_from([False] * (n - 1) + [True])


def junk() -> st.SearchStrategy[Any]:
    """A value of any JSON type, deep nesting and huge strings among them."""
    return st.one_of(
        json_values(),
        st.sampled_from([deep_value(45), deep_value(120), deep_value(400), 2**64, -(2**63) - 1]),
        st.just("x" * 100_000).filter(lambda _: True),
    )


def texts(wild: int) -> st.SearchStrategy[Any]:
    """A message's content: a text, text parts, or (wild) junk."""
    plain = st.sampled_from(TEXTS)
    parts = st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "binary", "image"]), "text": plain}
        ),
        min_size=1,
        max_size=3,
    )
    hostile = st.one_of(strings(), junk(), st.lists(junk(), max_size=3))
    return _one_in(wild).flatmap(lambda go: hostile if go else plain | parts)


def ids(service: FuzzService, kind: str, wild: int) -> st.SearchStrategy[Any]:
    """An id the fuzzing saw (`kind`: "chats" threads, "tools" calls and interrupts), or junk."""
    seen = service.ids.values(kind)
    hostile = st.one_of(strings(), junk(), st.just(str(uuid.UUID(int=7))))
    return _one_in(wild).flatmap(lambda go: hostile if go else seen)


@st.composite
def message(draw: st.DrawFn, service: FuzzService, role: Any, wild: int) -> Any:
    """A message of `role`: a tool message answers a call the fuzzing saw (or junk)."""
    if draw(_one_in(wild * 4)):
        return draw(junk())
    out: dict[str, Any] = {"id": draw(st.just("m-" + uuid.uuid4().hex[:8]) | strings())}
    if role is not None:
        out["role"] = role
    out["content"] = draw(texts(wild))
    if role == "tool":
        out["toolCallId"] = draw(ids(service, "tools", wild))
    elif role == "assistant" and draw(_one_in(3)):
        call = {"id": draw(ids(service, "tools", wild)), "type": "function"}
        call["function"] = {"name": "pick", "arguments": draw(st.just("{}") | strings())}
        out["toolCalls"] = [call]
    return out


@st.composite
def messages(draw: st.DrawFn, service: FuzzService, wild: int) -> Any:
    """The messages: earlier ones of any role, then a user message, or tool messages
    answering calls (the tool-result flow), or (wild) anything."""
    if draw(_one_in(wild * 4)):
        return draw(junk())
    role = st.sampled_from(ROLES) | (st.none() | junk() if wild < 8 else st.nothing())
    earlier = draw(st.lists(role.flatmap(lambda r: message(service, r, wild)), max_size=3))
    ending = draw(st.sampled_from(["user", "user", "tool", "tool", "none", "other"]))
    if ending == "user":
        earlier.append(draw(message(service, "user", wild)))
    elif ending == "tool":
        earlier += draw(st.lists(message(service, "tool", wild), min_size=1, max_size=2))
    elif ending == "other":
        earlier.append(draw(role.flatmap(lambda r: message(service, r, wild))))
    return earlier


@st.composite
def resume(draw: st.DrawFn, service: FuzzService, wild: int) -> Any:
    """`resume` entries answering interrupts the fuzzing saw, or with bad ids, or junk."""
    if draw(_one_in(wild)):
        return draw(junk())
    status = st.sampled_from(["resolved", "resolved", "cancelled"])
    if wild < 8:
        status = status | strings() | junk()
    entry = st.fixed_dictionaries(
        {"interruptId": ids(service, "tools", wild), "status": status},
        optional={"payload": json_values(finite=True) | junk()},
    )
    return draw(st.lists(entry, min_size=1, max_size=2))


@st.composite
def answers(draw: st.DrawFn, service: FuzzService, wild: int) -> tuple[Any, str | None]:
    """An input answering what a run left waiting (its tool calls by `tool` messages, its
    interrupts by `resume` entries), mostly by its owner, maybe bent; and the caller.

    What is drawn does not depend on what waits (Hypothesis replays the same choices
    against another state): both kinds of answer are drawn, the waiting one is used."""
    index = draw(st.integers(0, 2**16))
    waits = service.ids.waits[-8:] or [(CALLERS[0], "tool", "", [""])]
    caller, kind, thread, waiting = waits[index % len(waits)]
    if draw(_one_in(wild)):
        caller = draw(st.sampled_from(CALLERS))
    picked = [
        waiting[i % len(waiting)] for i in draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
    ]
    results = json_values(finite=True).map(to_json).map(bytes.decode) | texts(wild)
    contents = [draw(results) for _ in picked]
    status = st.sampled_from(["resolved", "resolved", "cancelled"])
    payload = st.sampled_from([True, False, None, "yes", {"approved": True}]) | junk()
    entries = [(draw(status), draw(payload)) for _ in picked]
    body: dict[str, Any] = {"threadId": thread, "runId": str(uuid.uuid4())}
    body["messages"] = [{"id": "m1", "role": "user", "content": "Hi"}]
    if kind == "tool":
        body["messages"] += [
            {"id": uuid.uuid4().hex, "role": "tool", "toolCallId": call_id, "content": content}
            for call_id, content in zip(picked, contents, strict=True)
        ]
    else:
        body["resume"] = [
            {"interruptId": i, "status": status, "payload": payload}
            for i, (status, payload) in zip(picked, entries, strict=True)
        ]
    if draw(_one_in(wild)):
        body = draw(bent(body, service, wild))
    return body, caller


def bent(body: dict[str, Any], service: FuzzService, wild: int) -> st.SearchStrategy[Any]:
    """`body` with one field replaced by junk or another id (or removed)."""
    others = {"threadId": ids(service, "chats", 2), "messages": messages(service, 2)}
    others["resume"] = resume(service, 2)
    return st.tuples(st.sampled_from(sorted(others)), st.booleans()).flatmap(
        lambda pick: (st.none() if pick[1] else others[pick[0]]).map(
            lambda value: {k: v for k, v in {**body, pick[0]: value}.items() if v is not None}
        )
    )


@st.composite
def inputs(draw: st.DrawFn, service: FuzzService) -> tuple[Any, str | None]:
    """A `RunAgentInput` (see the module docstring), as a JSON-able value, and the caller's
    Authorization header."""
    wild = draw(st.sampled_from([40, 40, 8, 2]), label="one part in")
    answer = draw(answers(service, wild))
    if draw(st.booleans()) and service.ids.waits:
        return answer
    caller = draw(st.sampled_from(CALLERS) if draw(_one_in(wild)) else st.just(CALLERS[0]))
    if draw(_one_in(wild * 4)):
        return draw(junk()), caller
    new_thread = st.builds(lambda: str(uuid.uuid4()))
    thread = draw(
        _one_in(3).flatmap(lambda known: ids(service, "chats", wild) if known else new_thread)
    )
    body: dict[str, Any] = {
        "threadId": thread,
        "runId": draw(_one_in(wild).flatmap(lambda go: junk() if go else new_thread)),
        "messages": draw(messages(service, wild)),
    }
    optional: dict[str, st.SearchStrategy[Any]] = {
        "state": st.just({}) | st.dictionaries(strings(), junk(), max_size=3) | junk(),
        "context": st.lists(
            st.fixed_dictionaries({"description": strings(), "value": strings()}), max_size=2
        )
        | junk(),
        "forwardedProps": st.dictionaries(strings(), junk(), max_size=3) | junk(),
        "tools": st.lists(st.fixed_dictionaries({"name": strings()}), max_size=2) | junk(),
        "resume": resume(service, wild),
        "parentRunId": strings(),
    }
    for name, values in optional.items():
        if draw(_one_in(3 if name == "resume" else wild)):
            body[name] = draw(values)
    for name in draw(st.lists(st.sampled_from(["threadId", "runId", "messages"]), max_size=1)):
        if draw(_one_in(wild)):
            del body[name]
    return body, caller


def check(answer: Answer) -> None:
    """No 5xx; a refusal is the envelope; a stream keeps AG-UI's rules (module docstring)."""
    assert answer.status < 500, f"{answer.status}: {answer.body[:300]!r}"
    if not answer.is_stream:
        assert answer.status >= 400, answer.body[:300]
        if answer.content_type.startswith("application/json"):
            check_envelope_of(answer)
        return
    assert answer.status == 200
    types = [event["type"] for event in answer.events]
    assert types and types[0] == "RUN_STARTED", types
    assert [t for t in types if t in TERMINALS] == [types[-1]], types
    opened: Counter[tuple[str, Any]] = Counter()
    for event in answer.events:
        kind = event["type"]
        if kind in PAIRS:
            opened[(kind, event.get(PAIRS[kind][1]))] += 1
        for start, (end, key) in PAIRS.items():
            if kind == end:
                assert opened[(start, event.get(key))] > 0, f"{kind} before its start: {types}"
                opened[(start, event.get(key))] -= 1
    assert +opened == Counter(), f"started, never ended: {+opened} in {types}"


def check_envelope_of(answer: Answer) -> None:
    """The error envelope (the HTTP fuzz's check, on this answer)."""
    check_envelope(HttpAnswer(answer.status, answer.content_type, answer.body))


def note(service: FuzzService, body: Any, caller: str | None, answer: Answer) -> None:
    """Keep the thread, the pending tool calls and the interrupts of a stream's end."""
    if not answer.is_stream or not answer.events or caller is None:
        return
    thread = body.get("threadId") or _chat_of(answer.events)
    service.ids.add("chats", thread)
    last = answer.events[-1]
    outcome = last.get("outcome") if isinstance(last.get("outcome"), dict) else {}
    calls = outcome.get("pendingToolCallIds", [])
    interrupts = [interrupt["id"] for interrupt in outcome.get("interrupts", [])]
    for kind, waits in (("tool", calls), ("interrupt", interrupts)):
        if waits:
            service.ids.wait(caller, kind, thread, waits)
        for wait_id in waits:
            service.ids.add("tools", wait_id)


def outcome(answer: Answer) -> str:
    """What an answer was, for the test's statistics: a status and reason, or how the run ended."""
    if not answer.is_stream:
        body = answer.json() if answer.content_type.endswith("json") else {}
        return f"{answer.status} {body.get('reason') or body.get('msg', '')[:50]}".strip()
    last = answer.events[-1]
    result = last.get("outcome") if isinstance(last.get("outcome"), dict) else {}
    resumed = (
        " (resumed)"
        if any(e["type"] == "RUN_STARTED" and "input" in e for e in answer.events)
        else ""
    )
    return f"{last['type']} {result.get('type', last.get('code', ''))}{resumed}".strip()


def _chat_of(events: list[Any]) -> str:
    """The chat a run on a new thread began (its `chat.start`, relayed as a CUSTOM event)."""
    for event in events:
        value = event.get("value") if event["type"] == "CUSTOM" else None
        if isinstance(value, dict) and isinstance(value.get("chatId"), str):
            return str(value["chatId"])
    return ""
