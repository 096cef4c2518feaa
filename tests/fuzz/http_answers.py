"""Sending a hostile HTTP request as it is, and checking what the adapter answers.

`send` sends a request with aiohttp as given (no normalisation of the path),
reads the answer (every SSE message of a stream), and keeps a streamed run
moving: it cancels the run when it waits on a frontend tool. `check` checks the
answer: never a 5xx, JSON answers are the envelope, streams are well-formed SSE
keeping the streaming rules, and no file outside the static directory is served.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from yarl import URL

from tests.fuzz.http_requests import HttpRequest
from tests.fuzz.kit import ALICE_KEY, CALL_TIMEOUT_S, MAX_MESSAGE_BYTES, FuzzService

TERMINAL_TYPES = frozenset({"run.complete", "run.error", "run.cancel"})
PASSWD = b"root:x:0:0"
#: Keys of the error envelope (`reason` and `metadata` only when the service sent them).
ENVELOPE_KEYS = frozenset({"code", "msg", "data", "status"})
OPTIONAL_KEYS = frozenset({"reason", "metadata"})


@dataclass
class HttpAnswer:
    """What came back: the status, the content type, the body or the SSE messages."""

    status: int
    content_type: str
    body: bytes = b""
    messages: list[dict[str, str]] = field(default_factory=list)


async def send(
    service: FuzzService, session: aiohttp.ClientSession, request: HttpRequest
) -> HttpAnswer | None:
    """Send `request` as it is; read the answer (every SSE message of a stream).

    None when the client could not read an answer: a request refused before it was
    read whole (too long a line, a body past the limit) can end with the connection
    closed under the client. The caller then checks that the service still answers.
    """
    try:
        return await _exchange(service, session, request)
    except aiohttp.ClientError:
        return None


async def alive(service: FuzzService, session: aiohttp.ClientSession) -> None:
    """The adapter answers a plain request."""
    url = service.harness.http_url + "/api/agents"
    async with session.get(url, headers={"Authorization": f"Bearer {ALICE_KEY}"}) as response:
        assert response.status == 200, await response.read()


async def _exchange(
    service: FuzzService, session: aiohttp.ClientSession, request: HttpRequest
) -> HttpAnswer:
    base = service.harness.http_url
    url = URL(base + request.path + (f"?{request.query}" if request.query else ""), encoded=True)
    async with (
        asyncio.timeout(CALL_TIMEOUT_S),
        session.request(
            request.method,
            url,
            headers=request.headers,
            data=request.body,
            allow_redirects=False,
        ) as response,
    ):
        content_type = response.headers.get("Content-Type", "")
        answer = HttpAnswer(response.status, content_type)
        if content_type.startswith("text/event-stream"):
            await read_events(service, session, request, response, answer)
        else:
            answer.body = await response.read()
        return answer


async def read_events(
    service: FuzzService,
    session: aiohttp.ClientSession,
    request: HttpRequest,
    response: aiohttp.ClientResponse,
    answer: HttpAnswer,
) -> None:
    """Parse the SSE messages as they come; cancel a run that waits on a frontend tool."""
    current: dict[str, str] = {}
    async for raw in response.content:
        line = raw.decode()
        assert line.endswith("\n"), f"an SSE line without its end: {line!r}"
        line = line[:-1]
        if not line:
            if current:
                answer.messages.append(current)
                await keep_moving(service, session, request, current)
            current = {}
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(": ")
        assert colon and name in ("id", "data", "event"), f"not an SSE field: {line!r}"
        assert name not in current, f"{name} twice in one SSE message"
        current[name] = value
    assert not current, f"an SSE message without its blank line: {current}"


async def keep_moving(
    service: FuzzService,
    session: aiohttp.ClientSession,
    request: HttpRequest,
    message: dict[str, str],
) -> None:
    """When the stream's run waits on a frontend tool, answer it with the request's `answer`
    (any JSON, NaN and all), or cancel the run, through HTTP; a refused answer cancels."""
    if "event" in message or "data" not in message:
        return
    event = orjson.loads(message["data"])
    service.ids.add("chats", str(event.get("chatId", "")))
    service.ids.add("runs", str(event.get("runId", "")))
    if event.get("type") != "tool.end" or not str(event.get("toolId", "")).startswith("t_"):
        return
    headers = [("Content-Type", "application/json")]
    authorization = request.header("Authorization")
    if authorization is not None:
        headers.append(("Authorization", authorization))
    base = service.harness.http_url
    run = orjson.dumps({"runId": event["runId"]})
    if request.answer is not None:
        tool = orjson.dumps({"runId": event["runId"], "toolId": event["toolId"]})
        body = tool[:-1] + b',"payload":' + request.answer + b"}"
        async with session.post(base + "/api/submit", headers=headers, data=body) as response:
            answer = await response.read()
            assert response.status < 500, answer
            if response.status == 200 and orjson.loads(answer)["data"].get("accepted"):
                return
    async with session.post(base + "/api/cancel", headers=headers, data=run) as response:
        assert response.status == 200, await response.read()


# Checks --------------------------------------------------------------------------------


def check(request: HttpRequest, answer: HttpAnswer) -> None:
    """No 5xx; JSON answers are the envelope; streams are well-formed SSE; no file leaks."""
    assert answer.status < 500, f"{answer.status}: {answer.body[:300]!r}"
    assert PASSWD not in answer.body, "a file outside the static directory was served"
    if request.method == "HEAD":
        assert answer.body == b""
    elif answer.content_type.startswith("application/json"):
        check_envelope(answer)
    elif answer.content_type.startswith("text/event-stream"):
        assert answer.status == 200
        check_events(request, answer)
    elif request.path.startswith("/api/") and answer.status >= 400:  # refused before routing
        assert answer.status in (400, 404, 405, 413, 431), (answer.status, answer.content_type)


def check_envelope(answer: HttpAnswer) -> None:
    body = orjson.loads(answer.body)
    if 200 <= answer.status < 300:
        assert (body["code"], body["msg"]) == (0, "success"), body
        return
    assert ENVELOPE_KEYS <= set(body) <= ENVELOPE_KEYS | OPTIONAL_KEYS, body
    assert isinstance(body["code"], int) and body["code"] != 0 and body["data"] is None, body
    assert isinstance(body["msg"], str) and body["msg"], body
    assert len(body["msg"].encode()) <= MAX_MESSAGE_BYTES, f"a message of {len(body['msg'])}"


def check_events(request: HttpRequest, answer: HttpAnswer) -> None:
    """Well-formed SSE: JSON data, ids that are the seqs, one terminal event, last."""
    events: list[dict[str, Any]] = []
    for index, message in enumerate(answer.messages):
        assert "data" in message, message
        data = orjson.loads(message["data"])
        if "event" in message:
            assert message["event"] == "error" and index == len(answer.messages) - 1, message
            assert data["code"] != 0 and data["data"] is None, data
            continue
        assert message.get("id") == str(data["seq"]), message
        events.append(data)
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(set(seqs)), f"seqs out of order: {seqs}"
    terminals = [i for i, e in enumerate(events) if e["type"] in TERMINAL_TYPES]
    started = any(e["type"] == "run.start" for e in events)
    if started or (events and request.route is not None and request.route.method.name != "Query"):
        assert terminals == [len(events) - 1], [e["type"] for e in events]
        assert len(events) == len(answer.messages), "an error after the run started"
