"""JSON ↔ protobuf for every unary RPC, and the request side of the streaming ones.

The adapter sits in front of a scripted gRPC service that records the request
it receives and answers a fixed reply, so both directions are checked exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx_sse
import pytest
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw
from google.protobuf import struct_pb2
from google.protobuf.message import Message

from service.core import events
from service.gateway.server import AGENT_GATEWAY
from tests.gateway.conftest import Adapter, Script, ScriptedService

JSON = {"Content-Type": "application/json"}


def value(data: Any) -> struct_pb2.Value:
    return events.to_value(data)


def struct(data: dict[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(data)
    return out


@dataclass
class Case:
    method: str
    http_method: str
    path: str
    sent: Message  # what the service must receive
    reply: Message
    data: dict[str, Any]  # the envelope's data
    params: list[tuple[str, str]] = field(default_factory=list)
    json: Any = None


SNAPSHOT = pb.Event(
    seq=4,
    type="content.snapshot",
    timestamp=1732200000000,
    chat_id="c1",
    run_id="r1",
    content_snapshot=pb.ContentSnapshot(content_id="r1_c_1", text="Hello"),
)
#: The snapshot as the adapter writes it: flat, camelCase, 64-bit numbers as numbers.
SNAPSHOT_JSON = {
    "seq": 4,
    "type": "content.snapshot",
    "timestamp": 1732200000000,
    "chatId": "c1",
    "runId": "r1",
    "contentId": "r1_c_1",
    "text": "Hello",
}

CASES = [
    Case(
        "Submit",
        "POST",
        "/api/submit",
        json={
            "requestId": "q1",
            "chatId": "c1",
            "runId": "r1",
            "toolId": "t_0000abcd",
            "payload": {"city": "Paris", "days": 2, "ok": True},
            "viewId": "v1",
        },
        sent=gw.SubmitRequest(
            request_id="q1",
            chat_id="c1",
            run_id="r1",
            tool_id="t_0000abcd",
            payload=value({"city": "Paris", "days": 2, "ok": True}),
            view_id="v1",
        ),
        reply=gw.SubmitResponse(
            accepted=True, outcome=gw.SUBMIT_OUTCOME_ACCEPTED, detail="delivered"
        ),
        data={"accepted": True, "outcome": "SUBMIT_OUTCOME_ACCEPTED", "detail": "delivered"},
    ),
    Case(
        "Cancel",
        "POST",
        "/api/cancel",
        json={"run_id": "r1", "requestId": "q2"},  # proto names are accepted in bodies too
        sent=gw.CancelRequest(run_id="r1", request_id="q2"),
        reply=gw.CancelResponse(cancelled=False, detail="the run had already ended"),
        data={"detail": "the run had already ended"},
    ),
    Case(
        "ListAgents",
        "GET",
        "/api/agents",
        sent=gw.ListAgentsRequest(),
        reply=gw.ListAgentsResponse(
            agents=[gw.Agent(key="a", name="A", mode=gw.AGENT_MODE_REACT, tools=["x", "y"])]
        ),
        data={
            "agents": [{"key": "a", "name": "A", "mode": "AGENT_MODE_REACT", "tools": ["x", "y"]}]
        },
    ),
    Case(
        "GetAgent",
        "GET",
        "/api/agent",
        params=[("agentKey", "a")],
        sent=gw.GetAgentRequest(agent_key="a"),
        reply=gw.GetAgentResponse(
            agent=gw.Agent(key="a"), definition=struct({"mode": "ONESHOT", "budget": {"n": 2}})
        ),
        data={"agent": {"key": "a"}, "definition": {"mode": "ONESHOT", "budget": {"n": 2.0}}},
    ),
    Case(
        "ListChats",
        "GET",
        "/api/chats",
        params=[("page_size", "5"), ("pageToken", "next")],
        sent=gw.ListChatsRequest(page_size=5, page_token="next"),
        reply=gw.ListChatsResponse(
            chats=[gw.ChatSummary(chat_id="c1", created_at=1732200000000, run_count=2)],
            next_page_token="more",
        ),
        data={
            "chats": [{"chatId": "c1", "createdAt": 1732200000000, "runCount": 2}],
            "nextPageToken": "more",
        },
    ),
    Case(
        "GetChat",
        "GET",
        "/api/chat",
        params=[("chatId", "c1"), ("liveRunOnly", "true")],
        sent=gw.GetChatRequest(chat_id="c1", live_run_only=True),
        reply=gw.GetChatResponse(chat_id="c1", chat_name="Hi"),
        data={"chatId": "c1", "chatName": "Hi"},
    ),
    Case(
        "GetChat",
        "GET",
        "/api/chat",
        params=[("chatId", "c1"), ("includeRawMessages", "true")],
        sent=gw.GetChatRequest(chat_id="c1", include_raw_messages=True),
        reply=gw.GetChatResponse(
            chat_id="c1", chat_name="Hi", events=[SNAPSHOT], raw_messages=[struct({"k": "v"})]
        ),
        data={
            "chatId": "c1",
            "chatName": "Hi",
            "events": [SNAPSHOT_JSON],
            "rawMessages": [{"k": "v"}],
        },
    ),
    Case(
        "ListModels",
        "GET",
        "/api/models",
        sent=gw.ListModelsRequest(),
        reply=gw.ListModelsResponse(
            providers=[gw.ProviderInfo(key="p", api="anthropic")],
            aliases=[
                gw.ModelAlias(
                    name="smart",
                    strategy="ordered",
                    deployments=[gw.Deployment(name="d", state="cooling_down", retry_at_ms=7)],
                )
            ],
        ),
        data={
            "providers": [{"key": "p", "api": "anthropic"}],
            "aliases": [
                {
                    "name": "smart",
                    "strategy": "ordered",
                    "deployments": [{"name": "d", "state": "cooling_down", "retryAtMs": 7}],
                }
            ],
        },
    ),
    Case(
        "Upload",
        "POST",
        "/api/upload",
        json={"name": "a.txt", "content": "aGVsbG8=", "mimeType": "text/plain"},
        sent=gw.UploadRequest(name="a.txt", content=b"hello", mime_type="text/plain"),
        reply=gw.UploadResponse(reference=pb.Reference(id="u1", size_bytes=5)),
        data={"reference": {"id": "u1", "sizeBytes": 5}},
    ),
    Case(
        "RenameChat",
        "PATCH",
        "/api/chats/c1",
        json={"chatName": "Trip", "requestId": "q3"},
        sent=gw.RenameChatRequest(chat_id="c1", chat_name="Trip", request_id="q3"),
        reply=gw.RenameChatResponse(chat=gw.ChatSummary(chat_id="c1", chat_name="Trip")),
        data={"chat": {"chatId": "c1", "chatName": "Trip"}},
    ),
    Case(
        "DeleteChat",
        "DELETE",
        "/api/chats/c1",
        params=[("cancelActiveRun", "true")],
        sent=gw.DeleteChatRequest(chat_id="c1", cancel_active_run=True),
        reply=gw.DeleteChatResponse(chat_id="c1", cancelled_run_id="r1", runs_deleted=2),
        data={"chatId": "c1", "cancelledRunId": "r1", "runsDeleted": 2},
    ),
    Case(
        "GetSpend",
        "GET",
        "/api/spend",
        params=[("tenant", "*"), ("firstDay", "2026-05-01")],
        sent=gw.GetSpendRequest(tenant="*", first_day="2026-05-01"),
        reply=gw.GetSpendResponse(
            rows=[gw.SpendRow(day="2026-05-01", api_key="ci", calls=3, cost=0.5)], currency="USD"
        ),
        data={
            "rows": [{"day": "2026-05-01", "apiKey": "ci", "calls": 3, "cost": 0.5}],
            "currency": "USD",
        },
    ),
    Case(
        "CreateAgent",
        "POST",
        "/api/admin/agents",
        json={"agentKey": "a", "definition": {"mode": "ONESHOT"}, "comment": "new"},
        sent=gw.CreateAgentRequest(
            agent_key="a", definition=struct({"mode": "ONESHOT"}), comment="new"
        ),
        reply=gw.AgentVersion(agent_key="a", version=1, change=gw.AGENT_CHANGE_CREATED),
        data={"agentKey": "a", "version": 1, "change": "AGENT_CHANGE_CREATED"},
    ),
    Case(
        "UpdateAgent",
        "PUT",
        "/api/admin/agents/a",
        json={"definitionText": "{}", "expectedVersion": 1},
        sent=gw.UpdateAgentRequest(agent_key="a", definition_text="{}", expected_version=1),
        reply=gw.AgentVersion(agent_key="a", version=2),
        data={"agentKey": "a", "version": 2},
    ),
    Case(
        "RollbackAgent",
        "POST",
        "/api/admin/agents/a/rollback",
        json={"version": 1},
        sent=gw.RollbackAgentRequest(agent_key="a", version=1),
        reply=gw.AgentVersion(agent_key="a", version=3, source_version=1),
        data={"agentKey": "a", "version": 3, "sourceVersion": 1},
    ),
    Case(
        "ListAgentVersions",
        "GET",
        "/api/admin/agents/a/versions",
        sent=gw.ListAgentVersionsRequest(agent_key="a"),
        reply=gw.ListAgentVersionsResponse(versions=[gw.AgentVersion(agent_key="a", version=1)]),
        data={"versions": [{"agentKey": "a", "version": 1}]},
    ),
    Case(
        "ListFiles",
        "GET",
        "/api/chats/c1/files",
        sent=gw.ListFilesRequest(chat_id="c1"),
        reply=gw.ListFilesResponse(
            files=[gw.WorkspaceFile(path="out/r.csv", size_bytes=2**40, mime_type="text/csv")]
        ),
        data={"files": [{"path": "out/r.csv", "sizeBytes": 2**40, "mimeType": "text/csv"}]},
    ),
    Case(
        "Start",
        "POST",
        "/api/runs",
        json={"agentKey": "a", "message": "Hi", "webhooks": [{"url": "https://h.example/x"}]},
        sent=gw.StartRequest(
            query=gw.QueryRequest(
                agent_key="a", message="Hi", webhooks=[gw.Webhook(url="https://h.example/x")]
            )
        ),
        reply=gw.StartResponse(run_id="r1", chat_id="c1"),
        data={"runId": "r1", "chatId": "c1"},
    ),
    Case(
        "Wait",
        "GET",
        "/api/runs/r1/wait",
        params=[("timeoutMs", "2500")],
        sent=gw.WaitRequest(run_id="r1", timeout_ms=2500),
        reply=gw.WaitResponse(status=gw.RUN_STATUS_ENDED, terminal=SNAPSHOT, last_seq=4),
        data={
            "status": "RUN_STATUS_ENDED",
            "terminal": SNAPSHOT_JSON,
            "lastSeq": 4,
        },
    ),
    Case(
        "CreateRunWebhook",
        "POST",
        "/api/runs/r1/webhooks",
        json={"url": "https://h.example/x", "format": "WEBHOOK_FORMAT_A2A", "token": "t"},
        sent=gw.CreateRunWebhookRequest(
            run_id="r1",
            webhook=gw.Webhook(url="https://h.example/x", format=gw.WEBHOOK_FORMAT_A2A, token="t"),
        ),
        reply=gw.RunWebhook(webhook_id="w1", run_id="r1", url="https://h.example/x"),
        data={"webhookId": "w1", "runId": "r1", "url": "https://h.example/x"},
    ),
    Case(
        "ListRunWebhooks",
        "GET",
        "/api/runs/r1/webhooks",
        sent=gw.ListRunWebhooksRequest(run_id="r1"),
        reply=gw.ListRunWebhooksResponse(webhooks=[gw.RunWebhook(webhook_id="w1")]),
        data={"webhooks": [{"webhookId": "w1"}]},
    ),
    Case(
        "GetRunWebhook",
        "GET",
        "/api/runs/r1/webhooks/w1",
        sent=gw.GetRunWebhookRequest(run_id="r1", webhook_id="w1"),
        reply=gw.RunWebhook(webhook_id="w1", format=gw.WEBHOOK_FORMAT_AGW),
        data={"webhookId": "w1", "format": "WEBHOOK_FORMAT_AGW"},
    ),
    Case(
        "DeleteRunWebhook",
        "DELETE",
        "/api/runs/r1/webhooks/w1",
        sent=gw.DeleteRunWebhookRequest(run_id="r1", webhook_id="w1"),
        reply=gw.DeleteRunWebhookResponse(),
        data={},
    ),
]


def test_every_unary_rpc_has_a_case() -> None:
    unary = {m.name for m in AGENT_GATEWAY.methods if not m.server_streaming}
    assert {case.method for case in CASES} == unary


@pytest.mark.parametrize("case", CASES, ids=[c.method for c in CASES])
async def test_unary_transcoding(case: Case, adapter: Adapter, scripted: ScriptedService) -> None:
    scripted.scripts[case.method] = Script(reply=case.reply)
    response = await adapter.http.request(
        case.http_method, case.path, params=case.params, json=case.json
    )
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("application/json")
    assert response.json() == {"code": 0, "msg": "success", "data": case.data}
    assert scripted.last(case.method) == case.sent


@pytest.mark.parametrize("name", ["agentKey", "agent_key"])
async def test_query_parameters_take_json_and_proto_names(
    name: str, adapter: Adapter, scripted: ScriptedService
) -> None:
    assert (await adapter.http.get("/api/agent", params={name: "k"})).json()["code"] == 0
    assert scripted.last("GetAgent") == gw.GetAgentRequest(agent_key="k")


async def test_query_body_reaches_the_service(adapter: Adapter, scripted: ScriptedService) -> None:
    scripted.scripts["Query"] = Script(messages=[SNAPSHOT])
    body = {
        "agentKey": "a",
        "message": "hi",
        "chatId": "c1",
        "params": {"x": [1, "two"]},
        "scene": {"page": "home"},
        "stream": False,
        "debugLevel": "DEBUG_LEVEL_FULL",
        "references": [{"id": "u1", "type": "file"}],
    }
    async with httpx_sse.aconnect_sse(adapter.http, "POST", "/api/query", json=body) as source:
        assert [sse.id async for sse in source.aiter_sse()] == ["4"]
    assert scripted.last("Query") == gw.QueryRequest(
        agent_key="a",
        message="hi",
        chat_id="c1",
        params=struct({"x": [1, "two"]}),
        scene=struct({"page": "home"}),
        stream=False,
        debug_level=gw.DEBUG_LEVEL_FULL,
        references=[pb.Reference(id="u1", type="file")],
    )


@pytest.mark.parametrize(
    ("params", "headers", "after_seq"),
    [
        ({}, {}, 0),
        ({"afterSeq": "3"}, {}, 3),
        ({"after_seq": "3"}, {"Last-Event-ID": "7"}, 7),
        ({}, {"Last-Event-ID": "12"}, 12),
    ],
)
async def test_attach_takes_the_path_and_last_event_id(
    params: dict[str, str],
    headers: dict[str, str],
    after_seq: int,
    adapter: Adapter,
    scripted: ScriptedService,
) -> None:
    response = await adapter.http.get("/api/runs/r-9/events", params=params, headers=headers)
    assert response.status_code == 204  # the scripted stream is empty
    assert scripted.last("Attach") == gw.AttachRequest(run_id="r-9", after_seq=after_seq)


async def test_headers_are_forwarded_as_metadata(
    adapter: Adapter, scripted: ScriptedService
) -> None:
    headers = {"Authorization": "Bearer t", "Grpc-Metadata-Tenant": "acme", "X-Other": "no"}
    assert (await adapter.http.get("/api/agents", headers=headers)).json()["code"] == 0
    metadata = dict(scripted.metadata[-1])
    assert (metadata["authorization"], metadata["tenant"]) == ("Bearer t", "acme")
    assert "x-other" not in metadata


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "needle"),
    [
        ("GET", "/api/chats", {"params": {"pageSize": "x"}}, "pageSize"),
        ("GET", "/api/chat", {"params": {"includeRawMessages": "maybe"}}, "true or false"),
        ("GET", "/api/agent", {"params": {"agentKay": "a"}}, "agentKay"),
        ("GET", "/api/chats", {"params": [("pageSize", "1"), ("pageSize", "2")]}, "more than once"),
        ("POST", "/api/cancel", {"content": b'{"runId": 1', "headers": JSON}, "invalid JSON"),
        ("POST", "/api/cancel", {"json": ["r1"]}, "JSON object"),
        ("POST", "/api/cancel", {"json": {"runID": "r1"}}, "runID"),
        (
            "POST",
            "/api/submit",
            {"content": b'{"payload": {"a": NaN}}', "headers": JSON},
            "invalid JSON",
        ),
        ("GET", "/api/runs/r1/events", {"headers": {"Last-Event-ID": "abc"}}, "Last-Event-ID"),
        ("GET", "/api/runs/r1/events", {"headers": {"Last-Event-ID": "-1"}}, "Last-Event-ID"),
        ("GET", "/api/runs/r1/events", {"headers": {"Last-Event-ID": "1_0"}}, "Last-Event-ID"),
        ("GET", "/api/runs/r1/events", {"headers": {"Last-Event-ID": "+3"}}, "Last-Event-ID"),
        (
            "GET",
            "/api/runs/r1/events",
            {"headers": {"Last-Event-ID": "٣".encode()}},
            "Last-Event-ID",
        ),
        ("GET", "/api/runs/r1/events", {"headers": {"Last-Event-ID": str(2**63)}}, str(2**63 - 1)),
        ("GET", "/api/runs/r1/events", {"headers": {"Last-Event-ID": "9" * 20}}, "seq"),
        ("GET", "/api/runs/r1/events", {"params": {"afterSeq": "-3"}}, "afterSeq"),
        ("GET", "/api/runs/r1/events", {"params": {"afterSeq": str(2**63)}}, "afterSeq"),
    ],
)
async def test_bad_requests_are_invalid_argument(
    method: str,
    path: str,
    kwargs: dict[str, Any],
    needle: str,
    adapter: Adapter,
    scripted: ScriptedService,
) -> None:
    response = await adapter.http.request(method, path, **kwargs)
    assert response.status_code == 400
    body = response.json()
    assert (body["code"], body["status"], body["data"]) == (3, "INVALID_ARGUMENT", None)
    assert needle in body["msg"]
    assert scripted.requests == []  # refused before calling the service
