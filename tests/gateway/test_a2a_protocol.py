"""The A2A endpoint's JSON-RPC and HTTP rules, its 0.3 dialect, and the adapter's defences.

Raw HTTP for what a client library would not send (bad JSON-RPC, wrong content
types, foreign origins); the official client's 0.3 transport for the older
protocol version.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.types import a2a_pb2 as a2a

from service.providers.loopback import LoopbackProvider
from tests.core.tools.kit import answer_turn, call_turn
from tests.gateway.a2a_kit import A2AService, a2a_service, brief, collect, text, user_message

SEND_V1 = {
    "jsonrpc": "2.0",
    "id": 7,
    "method": "SendMessage",
    "params": {"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "Hi"}]}},
}
STREAM_V03 = {
    "jsonrpc": "2.0",
    "id": "s-1",
    "method": "message/stream",
    "params": {
        "message": {
            "kind": "message",
            "messageId": "m-1",
            "role": "user",
            "parts": [{"kind": "text", "text": "Hi"}],
        }
    },
}


@pytest.fixture
async def service(tmp_path: Path, provider: LoopbackProvider) -> AsyncIterator[A2AService]:
    async with a2a_service(tmp_path, provider, http_max_body_bytes=4096) as running:
        yield running


def error_of(response: httpx.Response, request_id: Any = None) -> dict[str, Any]:
    """The JSON-RPC error of `response` (its id checked)."""
    body = response.json()
    assert (body["jsonrpc"], body["id"], "result" in body) == ("2.0", request_id, False)
    return body["error"]


def sse_data(raw: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]


# JSON-RPC errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "request_id", "code", "needle"),
    [
        (b"{not json", None, -32700, "invalid JSON"),
        (b"[]", None, -32600, "batch requests are not supported"),
        (b'"hello"', None, -32600, "a request must be a JSON object"),
        (b'{"jsonrpc": "1.0", "id": 1, "method": "SendMessage"}', 1, -32600, "'jsonrpc'"),
        (b'{"jsonrpc": "2.0", "id": true, "method": "SendMessage"}', None, -32600, "'id'"),
        (b'{"jsonrpc": "2.0", "id": "a", "method": 5}', "a", -32600, "'method'"),
        (b'{"jsonrpc": "2.0", "id": 2, "method": "tasks/list2"}', 2, -32601, "no method"),
        (b'{"jsonrpc": "2.0", "id": 3, "method": "GetTask", "params": []}', 3, -32602, "params"),
        (b'{"jsonrpc": "2.0", "id": 4, "method": "GetTask", "params": {}}', 4, -32602, "params.id"),
        (
            b'{"jsonrpc": "2.0", "id": 5, "method": "SendMessage", "params": {"message": {}}}',
            5,
            -32602,
            "message.role",
        ),
        (
            b'{"jsonrpc":"2.0","id":6,"method":"SendMessage","params":{"message":'
            b'{"messageId":"m","role":"ROLE_USER","parts":[{"raw":"aGk="}]}}}',
            6,
            -32005,
            "inline file bytes",
        ),
        (
            b'{"jsonrpc":"2.0","id":8,"method":"message/send","params":{"message":'
            b'{"messageId":"m","role":"ROLE_USER","parts":[{"kind":"text","text":"x"}]}}}',
            8,
            -32602,
            "message.role",
        ),
        (b'{"jsonrpc": "2.0", "id": 9, "method": "GetTask", "params": {"id": "x"}}', 9, -32001, ""),
        (b'{"jsonrpc": "2.0", "id": 10, "method": "ListTasks"}', 10, -32004, "not supported"),
        (
            b'{"jsonrpc": "2.0", "id": 11, "method": "tasks/pushNotificationConfig/set"}',
            11,
            -32602,
            "params.taskId",
        ),
        (b'{"jsonrpc": "2.0", "id": 12, "method": "GetExtendedAgentCard"}', 12, -32007, ""),
    ],
)
async def test_malformed_calls_get_their_json_rpc_error(
    service: A2AService, body: bytes, request_id: Any, code: int, needle: str
) -> None:
    response = await service.rpc("plain", body)
    assert response.status_code == 200
    error = error_of(response, request_id)
    assert error["code"] == code
    assert needle in error["message"]


async def test_service_refusals_keep_their_reason(service: A2AService) -> None:
    response = await service.rpc("nope", SEND_V1)
    error = error_of(response, 7)
    assert error["code"] == -32602
    assert error["message"].startswith("unknown agent 'nope'")
    assert error["data"] == [
        {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": "AGENT_NOT_FOUND",
            "domain": "agw.v1",
            "metadata": {"agent_key": "nope", "status": "NOT_FOUND"},
        }
    ]
    streamed = await service.rpc("nope", STREAM_V03)  # refused before any event: no stream
    assert streamed.headers["Content-Type"].startswith("application/json")
    assert error_of(streamed, "s-1")["data"][0]["reason"] == "AGENT_NOT_FOUND"
    unknown = await service.rpc(
        "plain", {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "zz"}}
    )
    assert error_of(unknown, 1)["data"][0]["reason"] == "RUN_NOT_FOUND"


async def test_unsupported_versions_are_refused(service: A2AService) -> None:
    response = await service.rpc("plain", SEND_V1, **{"A2A-Version": "2.0"})
    assert error_of(response, request_id=7)["code"] == -32009  # the request's id kept


# The adapter's defences ----------------------------------------------------------------


async def test_bodies_must_be_json_and_small(service: A2AService) -> None:
    plain = await service.rpc(
        "plain", json.dumps(SEND_V1).encode(), **{"Content-Type": "text/plain"}
    )
    assert plain.status_code == 415 and error_of(plain)["code"] == -32600
    large = {**SEND_V1, "padding": "x" * 5000}
    too_large = await service.rpc("plain", large)
    assert too_large.status_code == 413 and error_of(too_large)["message"] == "payload too large"
    assert service.provider.requests == []


async def test_foreign_origins_and_hosts_are_refused(service: A2AService) -> None:
    origin = await service.rpc("plain", SEND_V1, Origin="https://evil.example")
    assert origin.status_code == 403
    host = await service.rpc("plain", SEND_V1, Host="evil.example")
    assert host.status_code == 421
    card = await service.http.get(
        f"{service.url('plain')}/.well-known/agent-card.json", headers={"Host": "evil.example"}
    )
    assert card.status_code == 421
    assert service.provider.requests == []


async def test_the_credential_is_forwarded(tmp_path: Path, provider: LoopbackProvider) -> None:
    keys = [{"key": "s3cret", "tenant": "acme", "subject": "alice"}]
    async with a2a_service(tmp_path, provider, auth_api_keys=keys) as service:
        card = await service.http.get(f"{service.url('plain')}/.well-known/agent-card.json")
        assert card.status_code == 401
        refused = await service.rpc("plain", SEND_V1)
        assert refused.status_code == 401
        assert error_of(refused, 7)["data"][0]["reason"] == "UNAUTHENTICATED"
        provider.enqueue(answer_turn("Hello"))
        service.http.headers["Authorization"] = "Bearer s3cret"
        client = await service.client("plain")
        responses = await collect(client.send_message(user_message(text("Hi"))))
        assert brief(responses[-1]) == ("status", "completed")
        del service.http.headers["Authorization"]
        task_id = responses[0].task.id
        other = await service.rpc(
            "plain", {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}}
        )
        assert other.status_code == 401


# A2A 0.3 -----------------------------------------------------------------------------


async def test_the_0_3_client_streams_the_same_task(service: A2AService) -> None:
    service.provider.enqueue(answer_turn("Hel", "lo", reasoning="Hm"))
    client = await service.client("plain", version="0.3")
    responses = await collect(client.send_message(user_message(text("Hi"))))
    assert [brief(r) for r in responses] == [
        ("task", "submitted"),
        ("status", "submitted", "chat.start"),
        ("status", "working"),
        ("status", "working", "reasoning.start"),
        ("status", "working", "reasoning.delta"),
        ("status", "working", "reasoning.end"),
        ("artifact", "Hel", False, False),
        ("artifact", "lo", True, False),
        ("artifact", "Hello", False, True),
        ("status", "completed"),
    ]
    task = await client.get_task(a2a.GetTaskRequest(id=responses[0].task.id))
    assert task.status.state == a2a.TaskState.TASK_STATE_COMPLETED
    assert [a.parts[0].text for a in task.artifacts] == ["Hello"]


async def test_0_3_objects_carry_their_kinds(service: A2AService) -> None:
    service.provider.enqueue(
        call_turn(("call_f", "pick", '{"options":["a","b"]}')), answer_turn("a it is")
    )
    response = await service.rpc("ui", STREAM_V03)
    assert response.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    messages = sse_data(response.text)
    assert {(m["jsonrpc"], m["id"]) for m in messages} == {("2.0", "s-1")}
    results = [m["result"] for m in messages]
    assert [(r["kind"], r.get("status", {}).get("state"), r.get("final")) for r in results] == [
        ("task", "submitted", None),
        ("status-update", "submitted", False),
        ("status-update", "working", False),
        ("status-update", "working", False),
        ("status-update", "working", False),
        ("status-update", "working", False),
        ("status-update", "input-required", True),
    ]
    assert results[0]["history"][0] == {
        "messageId": "m-1",
        "role": "user",
        "parts": [{"kind": "text", "text": "Hi"}],
        "contextId": results[0]["contextId"],
        "taskId": results[0]["id"],
        "kind": "message",
    }
    question = results[-1]["status"]["message"]
    assert (question["kind"], question["role"]) == ("message", "agent")
    assert question["parts"][0] == {"kind": "text", "text": "pick waits for your answer"}
    assert question["parts"][1]["kind"] == "data"
    assert question["parts"][1]["data"]["waitType"] == "tool"
    follow_up = {
        "jsonrpc": "2.0",
        "id": "s-2",
        "method": "message/send",
        "params": {
            "message": {
                "kind": "message",
                "messageId": "m-2",
                "role": "user",
                "taskId": results[0]["id"],
                "parts": [{"kind": "data", "data": {"choice": "a"}}],
            }
        },
    }
    answered = (await service.rpc("ui", follow_up)).json()["result"]
    assert (answered["kind"], answered["status"]["state"]) == ("task", "completed")
    assert answered["artifacts"] == [
        {
            "artifactId": f"{results[0]['id']}_c_1",
            "name": "answer",
            "parts": [{"kind": "text", "text": "a it is"}],
        }
    ]


async def test_a_client_that_goes_away_ends_the_call(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    async with a2a_service(tmp_path, provider, disconnect_policy="cancel") as service:
        provider.enqueue(call_turn(("call_s", "forever", "{}")))
        body = {**SEND_V1, "method": "SendStreamingMessage"}
        async with service.http.stream(
            "POST", service.url("slow"), json=body, headers={"Accept": "text/event-stream"}
        ) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: ") and '"tool.end"' in line:
                    break
            await asyncio.wait_for(service.probe.started.wait(), 10)
        await asyncio.wait_for(service.probe.cancelled.wait(), 10)


def nested(depth: int) -> Any:
    """An object nested `depth` levels: {"k": {"k": ... "bottom"}}."""
    value: Any = "bottom"
    for _ in range(depth):
        value = {"k": value}
    return value


@pytest.mark.parametrize("depth", [45, 80])
async def test_an_answer_nested_too_deep_is_invalid_params(service: A2AService, depth: int) -> None:
    """An answer deeper than a Submit request may carry is refused (-32602), not an internal
    error, and the task still waits for a proper answer."""
    service.provider.enqueue(
        call_turn(("call_f", "pick", '{"options":["a","b"]}')), answer_turn("a it is")
    )
    first = {
        **SEND_V1,
        "params": {"message": {**SEND_V1["params"]["message"], "parts": [{"text": "Choose"}]}},
    }
    asked = (await service.rpc("ui", first)).json()["result"]["task"]
    assert asked["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    answer = {"messageId": "ans-1", "role": "ROLE_USER", "taskId": asked["id"]}
    deep = {**SEND_V1, "params": {"message": {**answer, "parts": [{"data": nested(depth)}]}}}
    refused = error_of(await service.rpc("ui", deep), request_id=7)
    assert refused["code"] == -32602, refused
    fine = {**SEND_V1, "params": {"message": {**answer, "parts": [{"data": {"choice": "a"}}]}}}
    done = (await service.rpc("ui", fine)).json()["result"]["task"]
    assert done["status"]["state"] == "TASK_STATE_COMPLETED"
