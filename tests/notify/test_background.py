"""Background runs: Start answers at once, Wait tells the end (or what the run waits for),
and a run started so is not abandoned for want of a follower; over gRPC and HTTP."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import httpx
import pytest
from agw.v1 import gateway_pb2 as gw
from google.protobuf import struct_pb2

from service.providers import loopback as lb
from service.providers.loopback import LoopbackProvider
from service.testing import Harness, write_agent
from tests.core.tools.kit import agent, answer_turn, call_turn, tools, write_ui_tools


def slow_answer(pause_s: float) -> list[lb.ScriptItem]:
    return [lb.Pause(pause_s), lb.content("Done."), lb.finish("stop"), lb.DONE]


@pytest.fixture
async def service(tmp_path: Path, provider: LoopbackProvider):
    agents = tmp_path / "agents"
    write_agent(agents, "plain", agent())
    write_agent(agents, "picker", agent(toolConfig=tools(frontends=("pick",))))
    tools_dir = write_ui_tools(tmp_path / "tools")
    async with Harness.start(
        agents, provider, tools_dir=tools_dir, unwatched_run_ttl_s=0.2
    ) as harness:
        yield harness


async def test_start_answers_at_once_and_wait_gives_the_end(
    service: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(slow_answer(0.6))
    began = time.monotonic()
    started = await service.stub.Start(
        gw.StartRequest(query=gw.QueryRequest(agent_key="plain", message="Hi"))
    )
    answered_s = time.monotonic() - began
    running = await service.stub.Wait(gw.WaitRequest(run_id=started.run_id))
    ended = await service.stub.Wait(gw.WaitRequest(run_id=started.run_id, timeout_ms=10_000))
    assert answered_s < 0.5 and started.run_id and started.chat_id
    assert (running.status, running.HasField("terminal"), running.chat_id) == (
        gw.RUN_STATUS_RUNNING,
        False,
        started.chat_id,
    )
    assert running.last_seq == 3  # request.query, chat.start, run.start: the model is slow
    assert ended.status == gw.RUN_STATUS_ENDED and ended.terminal.type == "run.complete"
    assert (ended.terminal.run_id, ended.last_seq) == (started.run_id, ended.terminal.seq)
    events = [e async for e in service.stub.Attach(gw.AttachRequest(run_id=started.run_id))]
    assert [e.type for e in events][-4:] == [
        "content.start",
        "content.delta",
        "content.end",
        "run.complete",
    ]


async def test_over_http_start_is_a_post_and_wait_a_get(
    service: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(slow_answer(0.3))
    async with httpx.AsyncClient(base_url=service.http_url, timeout=20) as http:
        started = await http.post("/api/runs", json={"agentKey": "plain", "message": "Hi"})
        run_id = started.json()["data"]["runId"]
        waited = await http.get(f"/api/runs/{run_id}/wait", params={"timeoutMs": 10_000})
        refused = await http.get(f"/api/runs/{run_id}/wait", params={"timeoutMs": 600_001})
        unknown = await http.get("/api/runs/nope/wait")
        bad = await http.post("/api/runs", json={"agentKey": "nope", "message": "Hi"})
    assert started.status_code == 200
    assert set(started.json()["data"]) == {"runId", "chatId"}
    body = waited.json()["data"]
    assert body["status"] == "RUN_STATUS_ENDED" and body["terminal"]["type"] == "run.complete"
    assert body["terminal"]["runId"] == run_id and body["lastSeq"] == body["terminal"]["seq"]
    assert refused.status_code == 400
    assert refused.json()["msg"] == "timeoutMs must be from 0 to 600000"
    assert (unknown.status_code, unknown.json()["reason"]) == (404, "RUN_NOT_FOUND")
    assert (bad.status_code, bad.json()["reason"]) == (404, "AGENT_NOT_FOUND")


async def test_wait_says_what_a_running_run_waits_for(
    service: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue(call_turn(("f1", "pick", '{"options": ["a"]}')), answer_turn("Picked."))
    started = await service.stub.Start(
        gw.StartRequest(query=gw.QueryRequest(agent_key="picker", message="Pick"))
    )
    waiting = await service.stub.Wait(gw.WaitRequest(run_id=started.run_id, timeout_ms=300))
    [wait] = waiting.waits
    reply = await service.stub.Submit(
        gw.SubmitRequest(
            run_id=started.run_id,
            tool_id=wait.tool_id,
            payload=struct_pb2.Value(string_value="a"),
        )
    )
    ended = await service.stub.Wait(gw.WaitRequest(run_id=started.run_id, timeout_ms=10_000))
    assert waiting.status == gw.RUN_STATUS_WAITING
    assert (wait.kind, wait.tool_name) == (gw.WAIT_KIND_FRONTEND_TOOL, "pick")
    assert reply.accepted
    assert ended.status == gw.RUN_STATUS_ENDED and ended.terminal.type == "run.complete"
    assert list(ended.waits) == []


async def test_a_started_run_is_not_abandoned_when_its_followers_leave(
    service: Harness, provider: LoopbackProvider
) -> None:
    """With `unwatched_run_ttl_s` of 0.2 s, a queried run nobody follows any more is cancelled;
    a started one goes on to its end."""
    provider.enqueue(slow_answer(1.0), slow_answer(1.0))
    queried = service.stub.Query(gw.QueryRequest(agent_key="plain", message="Hi"))
    first = await queried.read()
    queried.cancel()  # its only follower leaves
    started = await service.stub.Start(
        gw.StartRequest(query=gw.QueryRequest(agent_key="plain", message="Hi"))
    )
    follower = service.stub.Attach(gw.AttachRequest(run_id=started.run_id))
    await follower.read()
    follower.cancel()  # so does this one's
    await asyncio.sleep(0.5)
    abandoned = await service.stub.Wait(gw.WaitRequest(run_id=first.run_id, timeout_ms=5000))
    kept = await service.stub.Wait(gw.WaitRequest(run_id=started.run_id, timeout_ms=5000))
    assert abandoned.terminal.type == "run.cancel"
    assert abandoned.terminal.run_cancel.reason == "abandoned"
    assert kept.terminal.type == "run.complete"


async def test_waiting_for_another_users_run_is_not_found(
    tmp_path: Path, provider: LoopbackProvider
) -> None:
    write_agent(tmp_path / "agents", "plain", agent())
    keys = [{"key": "key-a", "subject": "a"}, {"key": "key-b", "subject": "b"}]
    provider.enqueue(answer_turn("Hi."))
    async with Harness.start(tmp_path / "agents", provider, auth_api_keys=keys) as service:
        started = await service.stub.Start(
            gw.StartRequest(query=gw.QueryRequest(agent_key="plain", message="Hi")),
            metadata=(("authorization", "Bearer key-a"),),
        )
        with pytest.raises(grpc.aio.AioRpcError) as hidden:
            await service.stub.Wait(
                gw.WaitRequest(run_id=started.run_id, timeout_ms=100),
                metadata=(("authorization", "Bearer key-b"),),
            )
    assert hidden.value.code() == grpc.StatusCode.NOT_FOUND
