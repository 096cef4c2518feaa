"""The A2A stream's relay in front of a scripted gRPC service: heartbeats, failures mid-stream.

What the real service seldom does on cue — a heartbeat, a call that fails after
its first events — is scripted here (see `ScriptedService`), and the raw SSE
the endpoint writes is checked.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
from agw.v1 import events_pb2 as pb

from tests.gateway.conftest import Adapter, Script, ScriptedService

STREAM = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "SendStreamingMessage",
    "params": {"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "Hi"}]}},
}


def event(seq: int, **payload: Any) -> pb.Event:
    (name,) = payload
    kind = name.replace("_", ".", 1)
    return pb.Event(
        seq=seq, type=kind, timestamp=1_700_000_000_000, chat_id="c1", run_id="r1", **payload
    )


async def test_heartbeats_are_comments_and_a_failure_ends_the_stream(
    adapter: Adapter, scripted: ScriptedService
) -> None:
    scripted.scripts["Query"] = Script(
        messages=[
            event(1, request_query=pb.RequestQuery(message="Hi", agent_key="plain")),
            pb.Event(type="heartbeat", run_id="r1", heartbeat=pb.Heartbeat()),
            event(2, run_start=pb.RunStart(agent_key="plain")),
        ],
        code=grpc.StatusCode.UNAVAILABLE,
        details="the service is draining",
    )
    response = await adapter.http.post(
        "/a2a/plain", json=STREAM, headers={"Authorization": "Bearer k1"}
    )
    assert response.status_code == 200
    blocks = response.text.split("\n\n")
    assert blocks[1] == ": heartbeat"
    data = [json.loads(b.removeprefix("data: ")) for b in blocks if b.startswith("data: ")]
    assert [next(iter(d.get("result", {"error": 0}))) for d in data] == [
        "task",
        "statusUpdate",
        "error",
    ]
    assert data[0]["result"]["task"]["status"] == {
        "state": "TASK_STATE_SUBMITTED",
        "timestamp": "2023-11-14T22:13:20.000Z",
    }
    assert data[2] == {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {
            "code": -32603,
            "message": "the service is draining",
            "data": [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "UNAVAILABLE",
                    "domain": "agw.v1",
                    "metadata": {"status": "UNAVAILABLE"},
                }
            ],
        },
    }
    query = scripted.last("Query")
    assert (query.agent_key, query.message, query.request_id) == ("plain", "Hi", "m-1")
    assert ("authorization", "Bearer k1") in scripted.metadata[-1]


async def test_a_run_that_ends_before_its_first_event_is_an_error(
    adapter: Adapter, scripted: ScriptedService
) -> None:
    response = await adapter.http.post("/a2a/plain", json=STREAM)
    body = response.json()
    assert body["error"]["code"] == -32603
    assert body["error"]["message"] == "the run ended before it started"
