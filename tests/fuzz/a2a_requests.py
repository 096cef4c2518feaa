"""Hostile A2A JSON-RPC requests, as Hypothesis strategies, and the checks of the answers.

`calls(service)` builds requests of every method of both dialects (1.0:
`SendMessage`...; 0.3: `message/send`...), the ones the endpoint does not offer
and unknown ones, with generated params: messages of every part kind and odd
ones, `taskId`s and `contextId`s the fuzzing saw (alice's, bob's, answered,
ended) or junk, `historyLength`s of any type; and envelopes that are near
JSON-RPC (ids of every type, no `jsonrpc`, another version, batches). `check`
checks an answer: never a 5xx; JSON is a JSON-RPC response with the request's
id; a stream is JSON-RPC responses of that id, an error only last. `note`
keeps the tasks and contexts the answers named, and those left input-required.
"""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import strategies as st

from tests.fuzz.agui_inputs import junk
from tests.fuzz.endpoints import CALLERS, Answer
from tests.fuzz.kit import FuzzService
from tests.fuzz.protos import json_values, strings

V1 = ("SendMessage", "SendStreamingMessage", "GetTask", "CancelTask", "SubscribeToTask")
V03 = ("message/send", "message/stream", "tasks/get", "tasks/cancel", "tasks/resubscribe")
PUSH_V1 = (
    "CreateTaskPushNotificationConfig",
    "GetTaskPushNotificationConfig",
    "ListTaskPushNotificationConfigs",
    "DeleteTaskPushNotificationConfig",
)
PUSH_V03 = tuple(f"tasks/pushNotificationConfig/{op}" for op in ("set", "get", "list", "delete"))
OTHERS = ("ListTasks", "GetExtendedAgentCard", "", "rpc.x")
#: Where a push configuration may point: a receiver of the fuzz (allowed), elsewhere, junk.
PUSH_URLS = ("http://127.0.0.1:9/push", "http://169.254.169.254/latest", "file:///etc/passwd")
SENDS = frozenset({"SendMessage", "SendStreamingMessage", "message/send", "message/stream"})
TEXTS = ("Hi", "What time is it in Paris?", "yes", "a")


def _one_in(n: int) -> st.SearchStrategy[bool]:
    """True one time in `n` (False first: the value Hypothesis starts and shrinks towards)."""
    return st.sampled_from([False] * (n - 1) + [True])


def _seen(service: FuzzService, kind: str, wild: int) -> st.SearchStrategy[Any]:
    hostile = strings() | junk()
    return _one_in(wild).flatmap(lambda go: hostile if go else service.ids.values(kind))


@st.composite
def part(draw: st.DrawFn, v03: bool, wild: int) -> Any:
    """A message part of the dialect: text, data, a url or file, raw bytes, or junk."""
    if draw(_one_in(wild * 2)):
        return draw(junk())
    kind = draw(st.sampled_from(["text", "text", "data", "file", "raw"]))
    text = st.sampled_from(TEXTS) | strings() if wild < 40 else st.sampled_from(TEXTS)
    data = st.dictionaries(strings(), json_values(finite=True), max_size=3) | junk()
    url = st.sampled_from(["https://example.com/a.txt", "file:///etc/passwd", ""]) | strings()
    if v03:
        out: dict[str, Any] = {"kind": kind}
        if kind == "text":
            out["text"] = draw(text)
        elif kind == "data":
            out["data"] = draw(data)
        else:
            file = {"uri": draw(url)} if kind == "file" else {"bytes": "aGk="}
            out["file"] = {**file, "name": draw(strings()), "mimeType": draw(strings())}
    else:
        out = {
            "text": {"text": draw(text)},
            "data": {"data": draw(data)},
            "file": {"url": draw(url), "filename": draw(strings())},
            "raw": {"raw": "aGk=", "mediaType": "text/plain"},
        }[kind]
    if draw(_one_in(wild)):
        out["metadata"] = draw(junk())
    return out


@st.composite
def message(draw: st.DrawFn, service: FuzzService, v03: bool, wild: int) -> Any:
    """A user message: text or data parts; a new task, or an answer to a task (its id, maybe
    another's); a context the fuzzing saw, or junk."""
    if draw(_one_in(wild * 4)):
        return draw(junk())
    role = "user" if v03 else draw(st.sampled_from(["ROLE_USER", "user"]))
    if draw(_one_in(wild)):
        role = draw(st.sampled_from(["agent", "ROLE_AGENT", "", "USER"]) | junk())
    out: dict[str, Any] = {
        "messageId": draw(st.just(str(uuid.uuid4())) | (strings() if wild < 8 else st.nothing())),
        "role": role,
        "parts": draw(st.lists(part(v03, wild), min_size=1, max_size=3)),
    }
    if v03:
        out["kind"] = "message"
    if draw(_one_in(3)):
        out["taskId"] = draw(_seen(service, "runs", wild))
    if draw(_one_in(3)):
        out["contextId"] = draw(_seen(service, "chats", wild))
    if draw(_one_in(wild)):
        out["metadata"] = draw(
            st.fixed_dictionaries({"waitId": _seen(service, "tools", 2)}) | junk()
        )
    for name in ("parts", "role", "messageId"):
        if draw(_one_in(wild * 2)):
            del out[name]
    return out


@st.composite
def params(draw: st.DrawFn, service: FuzzService, method: str, wild: int) -> Any:
    """Params for `method`: a message to send, or a task's id (and a history length)."""
    if draw(_one_in(wild * 4)):
        return draw(junk())
    v03 = "/" in method
    if method in SENDS:
        out: dict[str, Any] = {"message": draw(message(service, v03, wild))}
        if draw(_one_in(wild)):
            out["configuration"] = draw(junk())
        elif draw(_one_in(4)):
            config = draw(push_config(v03, wild))
            key = "pushNotificationConfig" if v03 else "taskPushNotificationConfig"
            out["configuration"] = {key: config}
        return out
    if method in PUSH_V1 + PUSH_V03:
        return draw(push_params(service, method, v03, wild))
    out = {"id": draw(_seen(service, "runs", wild))}
    if draw(_one_in(4)):
        out["historyLength"] = draw(st.sampled_from([0, 1, 5, -1, 2**70, 1.5, "2", True, None]))
    return out


@st.composite
def push_config(draw: st.DrawFn, v03: bool, wild: int) -> Any:
    """A push notification configuration of the dialect (or junk)."""
    if draw(_one_in(wild)):
        return draw(junk())
    config: dict[str, Any] = {"url": draw(st.sampled_from(PUSH_URLS) | strings())}
    if draw(st.booleans()):
        config["token"] = draw(st.sampled_from(["tok", ""]) | strings())
    if draw(_one_in(3)):
        scheme = draw(st.sampled_from(["Bearer", ""]) | strings())
        auth = {"schemes": [scheme]} if v03 else {"scheme": scheme}
        config["authentication"] = {**auth, "credentials": draw(strings())}
    if draw(_one_in(3)):
        config["id"] = draw(st.sampled_from(["p1", "p2"]) | strings())
    return config


@st.composite
def push_params(draw: st.DrawFn, service: FuzzService, method: str, v03: bool, wild: int) -> Any:
    """Params of a push configuration method: a task (maybe another's) and a configuration."""
    task = draw(_seen(service, "runs", wild))
    config_id = draw(st.sampled_from(["p1", "p2", ""]) | strings())
    if method.endswith(("set", "CreateTaskPushNotificationConfig")):
        config = draw(push_config(v03, wild))
        if v03:
            return {"taskId": task, "pushNotificationConfig": config}
        return {"taskId": task, **config} if isinstance(config, dict) else config
    if v03:
        return {"id": task, "pushNotificationConfigId": config_id}
    return {"taskId": task, "id": config_id}


@st.composite
def calls(draw: st.DrawFn, service: FuzzService) -> tuple[Any, str | None]:
    """A JSON-RPC request (see the module docstring) and the caller's Authorization header."""
    wild = draw(st.sampled_from([40, 40, 8, 2]), label="one part in")
    caller = draw(st.sampled_from(CALLERS) if draw(_one_in(wild)) else st.just(CALLERS[0]))
    answer = draw(answers(service, wild))
    if draw(st.booleans()) and service.ids.waits:
        return answer
    methods = st.sampled_from(V1 + V03 + PUSH_V1 + PUSH_V03)
    method = draw(
        _one_in(wild).flatmap(lambda go: st.sampled_from(OTHERS) | junk() if go else methods)
    )
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": draw(st.integers(0, 10**6) | st.just("r1"))}
    body["method"] = method
    body["params"] = draw(params(service, method if isinstance(method, str) else "", wild))
    if draw(_one_in(wild)):
        body["id"] = draw(junk())
    if draw(_one_in(wild)):
        body["jsonrpc"] = draw(st.sampled_from(["1.0", "2", 2.0, None]) | junk())
    for name in ("jsonrpc", "id", "method", "params"):
        if draw(_one_in(wild * 2)):
            del body[name]
    if draw(_one_in(wild * 2)):
        return draw(st.lists(st.just(body), min_size=0, max_size=2)), caller
    if draw(_one_in(wild * 4)):
        return draw(junk()), caller
    return body, caller


@st.composite
def answers(draw: st.DrawFn, service: FuzzService, wild: int) -> tuple[Any, str | None]:
    """A message answering a task left input-required (by its owner mostly), in either
    dialect. What is drawn does not depend on what waits (Hypothesis replays choices)."""
    index = draw(st.integers(0, 2**16))
    waits = service.ids.waits[-8:] or [(CALLERS[0], "task", "", [""])]
    caller, _, task, contexts = waits[index % len(waits)]
    if draw(_one_in(wild)):
        caller = draw(st.sampled_from(CALLERS))
    v03 = draw(st.booleans())
    method = draw(
        st.sampled_from(
            ["message/stream", "message/send"] if v03 else ["SendStreamingMessage", "SendMessage"]
        )
    )
    answer = draw(part(v03, wild))
    out: dict[str, Any] = {"messageId": str(uuid.uuid4()), "role": "user", "parts": [answer]}
    out["taskId"] = task
    context, other, bent = draw(_one_in(2)), draw(strings()), draw(_one_in(wild))
    if context:
        out["contextId"] = other if bent or not contexts else contexts[0]
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"message": out}}
    return body, caller


def check(body: Any, answer: Answer) -> None:
    """No 5xx; JSON-RPC responses of the request's id; a stream's error only last."""
    assert answer.status < 500, f"{answer.status}: {answer.body[:300]!r}"
    request_id = body.get("id") if isinstance(body, dict) else None
    unread = answer.status in (413, 415)  # refused before the body was read: no id known
    if unread or isinstance(request_id, bool) or not isinstance(request_id, str | int):
        request_id = None
    elif isinstance(request_id, int) and not -(2**63) <= request_id < 2**64:
        request_id = None  # read as a float by a JSON parser: not an id
    if not answer.is_stream:
        if not answer.content_type.startswith("application/json"):
            assert answer.status in (400, 403, 404, 405, 413, 421), answer.status
            return
        response = answer.json()
        if "code" in response and "jsonrpc" not in response:  # the adapter's own refusals
            assert answer.status in (403, 404, 405, 413, 421), response
            return
        _response(response, request_id)
        assert ("error" in response) == (answer.status != 200 or "result" not in response)
        return
    assert answer.status == 200 and answer.events, answer.events
    for index, response in enumerate(answer.events):
        _response(response, request_id)
        if "error" in response:
            assert index == len(answer.events) - 1, "an error before the stream's end"


def _response(response: Any, request_id: Any) -> None:
    assert response["jsonrpc"] == "2.0", response
    assert ("result" in response) != ("error" in response), response
    if "error" in response:
        error = response["error"]
        assert isinstance(error["code"], int) and isinstance(error["message"], str), error
        assert error["code"] != -32603, f"an internal error: {error}"
    unparsed = "error" in response and response["error"]["code"] == -32700  # no id known
    if request_id is not None and not unparsed:
        assert response["id"] == request_id, (response["id"], request_id)


def note(service: FuzzService, caller: str | None, answer: Answer) -> None:
    """Keep the tasks and contexts named; a task left input-required, to answer it."""
    if caller is None:
        return
    results = (
        [answer.json()]
        if not answer.is_stream and answer.content_type.endswith("json")
        else answer.events
    )
    task, context, waiting = "", "", False
    for response in results:
        result = response.get("result") if isinstance(response, dict) else None
        if not isinstance(result, dict):
            continue
        result = result.get("task") or result.get("statusUpdate") or result
        task = result.get("taskId") or (result.get("id") if "status" in result else "") or task
        context = result.get("contextId") or context
        state = (result.get("status") or {}).get("state", "")
        waiting = state in ("TASK_STATE_INPUT_REQUIRED", "input-required")
    service.ids.add("runs", task)
    service.ids.add("chats", context)
    if waiting and task:
        service.ids.wait(caller, "task", task, [context])


def outcome(answer: Answer) -> str:
    """What an answer was, for the test's statistics."""
    results = (
        [answer.json()]
        if not answer.is_stream and answer.content_type.endswith("json")
        else answer.events
    )
    last = results[-1] if results else {}
    if not isinstance(last, dict):
        return str(answer.status)
    if "error" in last:
        error = last["error"]
        return f"{answer.status} error {error.get('code')} {str(error.get('message'))[:40]}"
    if "result" in last:
        result = last["result"]
        inner = result.get("task") or result.get("statusUpdate") or result
        status = inner.get("status") if isinstance(inner, dict) else None
        form = "stream" if answer.is_stream else "result"
        return f"{answer.status} {form} {(status or {}).get('state', '')}"
    return f"{answer.status} {str(last)[:40]}"
