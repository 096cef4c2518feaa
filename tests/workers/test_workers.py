"""Two workers on one port: connections spread over both, any worker serves any run, a killed
worker is replaced, SIGTERM drains them all."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from typing import Any

import grpc
import httpx
import pytest
from agw.v1 import gateway_pb2 as gw
from agw.v1 import gateway_pb2_grpc
from google.protobuf import json_format, struct_pb2

from bench.workers import socket_inodes, tcp_connections
from tests.bus.conftest import eventually
from tests.workers.conftest import BASE, KEYS, Models, Service, auth, rest, until

HEAD = ["request.query", "chat.start", "run.start"]
PICK = ["tool.start", "tool.args", "tool.args", "tool.end"]
ANSWER = ["content.start", "content.delta", "content.end", "run.complete"]


def kinds(events: list[Any]) -> list[str]:
    return [e.type for e in events]


def stub(channel: grpc.aio.Channel) -> gateway_pb2_grpc.AgentGatewayAsyncStub:
    return gateway_pb2_grpc.AgentGatewayStub(channel)


async def test_connections_land_on_both_workers_of_one_port(service: Service) -> None:
    channels = [service.channel() for _ in range(16)]
    try:
        landed = [await service.worker_of(channel) for channel in channels]
    finally:
        for channel in channels:
            await channel.close()
    assert set(landed) == {f"{BASE}-0", f"{BASE}-1"}
    workers = service.workers()
    assert sorted(workers) == [0, 1]
    assert {replica for _, replica in workers.values()} == {f"{BASE}-0", f"{BASE}-1"}
    assert service.process.pid not in {pid for pid, _ in workers.values()}


async def test_attach_and_submit_on_one_worker_reach_a_run_on_the_other(
    service: Service,
) -> None:
    on_0 = await service.connection_to(f"{BASE}-0")
    on_1 = await service.connection_to(f"{BASE}-1")
    try:
        call = stub(on_0).Query(gw.QueryRequest(agent_key="ui", message="choose"), metadata=auth())
        seen: list[Any] = []
        end = await until(call, "tool.end", seen)
        run_id, tool_id = end.run_id, end.tool_end.tool_id
        assert await service.owner(run_id) == f"{BASE}-0"
        following = stub(on_1).Attach(gw.AttachRequest(run_id=run_id), metadata=auth())
        followed: list[Any] = []
        await until(following, "tool.end", followed)
        payload = struct_pb2.Value()
        json_format.ParseDict("b", payload)
        submitted = await stub(on_1).Submit(
            gw.SubmitRequest(run_id=run_id, tool_id=tool_id, payload=payload), metadata=auth()
        )
        seen += await rest(call)
        followed += await rest(following)
    finally:
        await on_0.close()
        await on_1.close()
    assert submitted.outcome == gw.SUBMIT_OUTCOME_ACCEPTED
    assert kinds(seen) == [*HEAD, *PICK, "request.submit", "tool.result", *ANSWER]
    assert kinds(followed) == kinds(seen), (kinds(followed), kinds(seen))
    assert followed == seen
    assert seen[-3].content_delta.delta == "you picked b"


async def test_cancel_on_one_worker_stops_a_run_on_the_other(
    service: Service, models: Models
) -> None:
    on_0 = await service.connection_to(f"{BASE}-0")
    on_1 = await service.connection_to(f"{BASE}-1")
    try:
        call = stub(on_1).Query(gw.QueryRequest(agent_key="plain", message="hold"), metadata=auth())
        seen: list[Any] = []
        delta = await until(call, "content.delta", seen)
        assert await service.owner(delta.run_id) == f"{BASE}-1"
        cancelled = await stub(on_0).Cancel(gw.CancelRequest(run_id=delta.run_id), metadata=auth())
        seen += await rest(call)
    finally:
        models.release()
        await on_0.close()
        await on_1.close()
    assert cancelled.cancelled
    assert kinds(seen) == [*HEAD, "content.start", "content.delta", "content.end", "run.cancel"]


async def test_an_upload_to_one_worker_is_read_by_a_query_on_the_other_for_its_owner_only(
    service: Service, models: Models
) -> None:
    on_0 = await service.connection_to(f"{BASE}-0")
    on_1 = await service.connection_to(f"{BASE}-1")
    try:
        uploaded = await stub(on_0).Upload(
            gw.UploadRequest(name="note.txt", content=b"the secret word is teal"),
            metadata=auth("alice"),
        )
        reference = uploaded.reference
        query = gw.QueryRequest(agent_key="plain", message="ping: read", references=[reference])
        events = await rest(stub(on_1).Query(query, metadata=auth("alice")))
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # another owner's upload
            await rest(stub(on_1).Query(query, metadata=auth("bob")))
    finally:
        await on_0.close()
        await on_1.close()
    assert await service.owner(events[0].run_id) == f"{BASE}-1"
    assert events[-1].type == "run.complete"
    user = models.requests[-1]["messages"][-1]
    assert [part["text"] for part in user["content"] if part["type"] == "text"] == [
        "ping: read",
        "[file note.txt]\nthe secret word is teal",
    ]
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert refused.value.details() == f"no upload {reference.id!r}"


async def test_a_killed_workers_run_resumes_on_the_other_and_the_worker_is_replaced(
    service: Service, models: Models
) -> None:
    """kill -9 of the worker running a run: the other worker finds it lost (its lease
    expired) and resumes it from the journal (PostgreSQL) — the turn in flight asked again —
    while the supervisor starts a new worker 0. The dead worker's own client is cut
    (UNAVAILABLE, no reason: no worker was left to give one) and re-attaches elsewhere."""
    on_0 = await service.connection_to(f"{BASE}-0")
    on_1 = await service.connection_to(f"{BASE}-1")
    pid, _replica = service.workers()[0]
    try:
        call = stub(on_0).Query(gw.QueryRequest(agent_key="plain", message="hold"), metadata=auth())
        seen: list[Any] = []
        delta = await until(call, "content.delta", seen)
        following = stub(on_1).Attach(gw.AttachRequest(run_id=delta.run_id), metadata=auth())
        followed: list[Any] = []
        await until(following, "content.delta", followed)
        asked = len(models.requests)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(grpc.aio.AioRpcError) as cut:  # the dead worker's own client ...
            seen += await rest(call)

        async def asked_again() -> bool:
            return len(models.requests) > asked

        await eventually(asked_again, timeout_s=15)  # the other worker resumed the run
        models.release()
        followed += await rest(following)
        reattach = gw.AttachRequest(run_id=delta.run_id, after_seq=seen[-1].seq)
        reattached = await rest(stub(on_1).Attach(reattach, metadata=auth()))  # ... elsewhere
        restarted = await service.wait_log(rf"worker 0 started \(pid (\d+), replica {BASE}-0\.1\)")
        await service.wait_log(rf"worker 0 \(pid {restarted.group(1)}\) listening")
        query = gw.QueryRequest(agent_key="plain", message="ping")
        served = await rest(stub(on_1).Query(query, metadata=auth()))
        on_new = await service.connection_to(f"{BASE}-0.1")
        await on_new.close()
    finally:
        models.release()
        await on_0.close()
        await on_1.close()
    assert f"worker 0 (pid {pid}) exited with code -9" in service.log()
    assert kinds(followed) == [
        *HEAD,
        "content.start",
        "content.delta",
        "content.end",
        "run.resume",
        "content.start",
        "content.delta",
        "content.delta",
        "content.end",
        "run.complete",
    ]
    resume = followed[len(HEAD) + 3].run_resume
    assert (resume.reason, resume.attempt) == ("owner_lost", 1)
    assert resume.replica in (f"{BASE}-1", f"{BASE}-0.1")
    assert models.requests[asked]["messages"] == models.requests[asked - 1]["messages"]
    assert cut.value.code() == grpc.StatusCode.UNAVAILABLE
    assert not [key for key, _ in cut.value.trailing_metadata() or () if key.endswith("-bin")]
    assert seen == followed[: len(seen)] and reattached == followed[len(seen) :]
    assert kinds(served) == [*HEAD, *ANSWER]


async def test_sigterm_drains_every_worker(service: Service, models: Models) -> None:
    on_0 = await service.connection_to(f"{BASE}-0")
    on_1 = await service.connection_to(f"{BASE}-1")
    try:
        calls = [
            stub(channel).Query(gw.QueryRequest(agent_key="plain", message="hold"), metadata=auth())
            for channel in (on_0, on_1)
        ]
        seen: list[list[Any]] = [[], []]
        for call, events in zip(calls, seen, strict=True):
            await until(call, "content.delta", events)
        service.process.send_signal(signal.SIGTERM)
        await service.wait_log(r"stopping: draining runs(?s:.*)stopping: draining runs")
        models.release()  # the held runs finish within the grace period
        for call, events in zip(calls, seen, strict=True):
            events += await rest(call)
        code = await asyncio.wait_for(service.process.wait(), 30)
    finally:
        await on_0.close()
        await on_1.close()
    assert code == 0
    for events in seen:
        assert kinds(events) == [*HEAD, "content.start", "content.delta", *ANSWER[1:]]
    for slot, (pid, _replica) in service.workers().items():
        assert f"worker {slot} (pid {pid}) exited with code 0" in service.log()


async def test_each_worker_runs_the_queries_its_http_adapter_receives(service: Service) -> None:
    """The HTTP port is shared like the gRPC one; a worker's adapter calls its own gRPC
    server, so a query runs on the worker that took its HTTP connection."""
    headers = {"authorization": f"Bearer {KEYS['alice']}"}
    url = f"http://127.0.0.1:{service.http_port}/api/query"
    replicas = {pid: replica for pid, replica in service.workers().values()}

    async def query(client: httpx.AsyncClient) -> tuple[str, str]:
        """The worker holding the client's connection, and the owner of its run."""
        body = {"agentKey": "plain", "message": "ping"}
        async with client.stream("POST", url, json=body) as response:
            assert response.status_code == 200
            port = response.extensions["network_stream"].get_extra_info("client_addr")[1]
            holder = _holder(service.http_port, port, list(replicas))
            run_id = ""
            async for line in response.aiter_lines():
                if line.startswith("data: ") and not run_id:
                    run_id = json.loads(line[6:])["runId"]
        return replicas[holder], await service.owner(run_id)

    clients = [httpx.AsyncClient(headers=headers) for _ in range(16)]
    try:
        served = await asyncio.gather(*(query(client) for client in clients))
    finally:
        for client in clients:
            await client.aclose()
    assert {holder for holder, _ in served} == {f"{BASE}-0", f"{BASE}-1"}
    assert [owner for _, owner in served] == [holder for holder, _ in served]


async def test_every_worker_line_names_its_worker_and_http_calls_their_client(
    service: Service,
) -> None:
    """Each worker tags its lines `[w0]`/`[w1]` (the supervisor's carry no tag); a call its
    HTTP adapter makes over its private unix socket is logged with the HTTP client's
    address, never the socket's empty peer (`unix:`)."""
    headers = {"authorization": f"Bearer {KEYS['alice']}"}
    url = f"http://127.0.0.1:{service.http_port}/api/agents"
    async with httpx.AsyncClient(headers=headers) as client:
        for _ in range(8):
            response = await client.get(url, headers={"connection": "close"})
            assert response.status_code == 200
    await service.wait_log(r"\[w\d\] agw\.grpc: ListAgents from ")
    lines = service.log().splitlines()
    for slot in service.workers():
        assert any(f" [w{slot}] agw.grpc: gRPC listening on " in line for line in lines)
    tagged = [line for line in lines if re.search(r" \[w[01]\] agw\.", line)]
    untagged = [line for line in lines if " agw." in line and line not in tagged]
    assert untagged and all(" agw.supervisor: " in line for line in untagged)
    calls = [line for line in tagged if "agw.grpc: ListAgents from " in line]
    assert calls and all(" ListAgents from 127.0.0.1: OK in " in line for line in calls)
    assert "from unix" not in service.log()


def _holder(port: int, client_port: int, pids: list[int]) -> int:
    """Which of `pids` holds the server side of the connection from `client_port` to `port`."""
    inodes = {
        inode
        for local, remote, inode in tcp_connections(port)
        if local == port and remote == client_port
    }
    for pid in pids:
        if inodes & socket_inodes(pid):
            return pid
    raise AssertionError(f"no worker holds the connection from port {client_port}")


def _established(pid: int, port: int) -> int:
    """How many established TCP connections to local `port` the process `pid` holds."""
    inodes = {inode for local, _, inode in tcp_connections(port) if local == port}
    return len(inodes & socket_inodes(pid))
