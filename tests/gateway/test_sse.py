"""Server-streaming RPCs as Server-Sent Events, end to end through the whole service.

Real transports all the way: an SSE client library (httpx-sse) or a raw socket
→ the adapter → gRPC on loopback → the runtime → the HTTP client → the fake
provider.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import httpx_sse
import orjson
import pytest
from agw.v1 import gateway_pb2 as gw

from service.gateway import codec
from service.gateway.sse import EventStream
from service.providers.loopback import DONE, Gate, LoopbackProvider, content, finish
from service.testing import Harness

QUERY = {"agentKey": "plain", "message": "Hi there"}


async def sse_events(source: httpx_sse.EventSource) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    async for sse in source.aiter_sse():
        assert sse.event == "message"
        yield sse.id, orjson.loads(sse.data)


async def read_until(
    events: AsyncIterator[tuple[str, dict[str, Any]]], kind: str
) -> list[dict[str, Any]]:
    seen = []
    async for _, event in events:
        seen.append(event)
        if event["type"] == kind:
            return seen
    raise AssertionError(f"stream ended before {kind}")


async def test_each_event_is_one_sse_message_in_the_contract_json(
    gateway: Harness, http: httpx.AsyncClient, provider: LoopbackProvider
) -> None:
    provider.enqueue([content("Hel"), content("lo"), finish("stop"), DONE])
    async with httpx_sse.aconnect_sse(http, "POST", "/api/query", json=QUERY) as source:
        headers = source.response.headers
        received = [item async for item in sse_events(source)]
    assert headers["Content-Type"] == "text/event-stream; charset=utf-8"
    assert (headers["Cache-Control"], headers["X-Accel-Buffering"]) == ("no-cache", "no")
    assert [e["type"] for _, e in received] == [
        "request.query",
        "chat.start",
        "run.start",
        "content.start",
        "content.delta",
        "content.delta",
        "content.end",
        "run.complete",
    ]
    assert [sse_id for sse_id, _ in received] == [str(n) for n in range(1, 9)]
    run_id, chat_id = received[0][1]["runId"], received[0][1]["chatId"]
    delta = received[4][1]
    assert delta == {
        "seq": 5,
        "type": "content.delta",
        "timestamp": delta["timestamp"],
        "chatId": chat_id,
        "runId": run_id,
        "contentId": f"{run_id}_c_1",
        "delta": "Hel",
    }
    assert isinstance(delta["timestamp"], int)
    # The same events over gRPC, as JSON, are exactly what SSE carried.
    grpc_events = [e async for e in gateway.stub.Attach(gw.AttachRequest(run_id=run_id))]
    assert [codec.to_dict(e) for e in grpc_events] == [event for _, event in received]


async def test_each_event_is_flushed_before_the_next_exists(
    http: httpx.AsyncClient, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue([content("first"), Gate(gate), content("second"), finish("stop"), DONE])
    async with httpx_sse.aconnect_sse(http, "POST", "/api/query", json=QUERY) as source:
        events = sse_events(source)
        seen = await read_until(events, "content.delta")
        assert seen[-1]["delta"] == "first"
        assert not gate.is_set()  # the provider still holds the next delta back
        gate.set()
        rest = [event["type"] async for _, event in events]
    assert rest == ["content.delta", "content.end", "run.complete"]


@pytest.fixture
async def fast_heartbeat(agents_dir: Path, provider: LoopbackProvider) -> AsyncIterator[Harness]:
    async with Harness.start(agents_dir, provider, http_heartbeat_s=0.05) as harness:
        yield harness


async def test_heartbeat_comments_fill_silences(
    fast_heartbeat: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue([content("a"), Gate(gate), content("b"), finish("stop"), DONE])
    lines: list[str] = []
    async with (
        httpx.AsyncClient(base_url=fast_heartbeat.http_url) as http,
        http.stream("POST", "/api/query", json=QUERY) as response,
    ):
        async for line in response.aiter_lines():
            lines.append(line)
            if line == ": heartbeat" and '"delta":"a"' in "".join(lines):
                gate.set()  # a heartbeat came during the silence after "a"
    assert gate.is_set()
    data = [json.loads(line[6:])["type"] for line in lines if line.startswith("data: ")]
    assert data[-3:] == ["content.delta", "content.end", "run.complete"]
    assert lines.count(": heartbeat") >= 1
    # Each heartbeat is a whole SSE message of its own: comment line, blank line.
    for index, line in enumerate(lines):
        if line == ": heartbeat":
            assert lines[index + 1] == ""


async def test_attach_at_the_live_end_opens_with_a_heartbeat(
    fast_heartbeat: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue([content("a"), Gate(gate), content("b"), finish("stop"), DONE])
    async with (
        httpx.AsyncClient(base_url=fast_heartbeat.http_url, timeout=10) as http,
        httpx_sse.aconnect_sse(http, "POST", "/api/query", json=QUERY) as query,
    ):
        head = await read_until(sse_events(query), "content.delta")
        url = f"/api/runs/{head[0]['runId']}/events"
        headers = {"Last-Event-ID": str(head[-1]["seq"])}
        async with http.stream("GET", url, headers=headers) as attached:
            assert attached.status_code == 200  # before any event: the heartbeat opened it
            lines = attached.aiter_lines()
            assert await anext(lines) == ": heartbeat"
            gate.set()
            rest = [line async for line in lines if line.startswith("id: ")]
    assert rest == [f"id: {n}" for n in range(head[-1]["seq"] + 1, head[-1]["seq"] + 4)]


async def test_last_event_id_resumes_at_every_seq_without_gap_or_duplicate(
    gateway: Harness, http: httpx.AsyncClient, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue([content("a"), content("b"), Gate(gate), content("c"), finish("stop"), DONE])
    async with httpx_sse.aconnect_sse(http, "POST", "/api/query", json=QUERY) as query:
        owner = sse_events(query)
        head = await read_until(owner, "content.delta")
        head += await read_until(owner, "content.delta")
        run_id, live_end = head[0]["runId"], head[-1]["seq"]
        url = f"/api/runs/{run_id}/events"

        # While the run is live: replay from every seq, then detach.
        for after in range(live_end + 1):
            headers = {"Last-Event-ID": str(after)}
            async with httpx_sse.aconnect_sse(http, "GET", url, headers=headers) as attached:
                events = sse_events(attached)
                replayed = [await anext(events) for _ in range(live_end - after)]
            assert [int(i) for i, _ in replayed] == list(range(after + 1, live_end + 1))
            assert [e for _, e in replayed] == head[after:]

        # Across the replay-to-live hand-off: resume one behind, then the run goes on.
        headers = {"Last-Event-ID": str(live_end - 1)}
        async with httpx_sse.aconnect_sse(http, "GET", url, headers=headers) as attached:
            events = sse_events(attached)
            first = await anext(events)
            gate.set()
            followed = [first] + [item async for item in events]
        whole = head + [event async for _, event in owner]
    assert [int(i) for i, _ in followed] == list(range(live_end, len(whole) + 1))
    assert [e for _, e in followed] == whole[live_end - 1 :]

    # After the end: every resume point replays exactly the rest; the end itself is empty.
    for after in range(len(whole) + 1):
        headers = {"Last-Event-ID": str(after)}
        response = await http.get(url, headers=headers)
        if after == len(whole):
            assert response.status_code == 204
            continue
        async with httpx_sse.aconnect_sse(http, "GET", url, headers=headers) as attached:
            rest = [event async for _, event in sse_events(attached)]
        assert rest == whole[after:]


async def test_client_going_away_cancels_the_run_under_the_cancel_policy(
    cancelling_gateway: Harness, provider: LoopbackProvider
) -> None:
    provider.enqueue([content("so far"), Gate(asyncio.Event()), DONE])
    async with (
        httpx.AsyncClient(base_url=cancelling_gateway.http_url) as http,
        httpx_sse.aconnect_sse(http, "POST", "/api/query", json=QUERY) as source,
    ):
        seen = await read_until(sse_events(source), "content.delta")
    run = cancelling_gateway.app.frontdoor.get_run(seen[0]["runId"])
    await asyncio.wait_for(run.wait(), 5)
    assert run.log[-1].type == "run.cancel"
    assert run.log[-1].run_cancel.reason == "disconnect"
    await provider.wait_connections(0, timeout=5)


async def test_client_going_away_detaches_under_the_continue_policy(
    gateway: Harness, http: httpx.AsyncClient, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue([content("so far"), Gate(gate), content(" and more"), finish("stop"), DONE])
    async with httpx_sse.aconnect_sse(http, "POST", "/api/query", json=QUERY) as source:
        seen = await read_until(sse_events(source), "content.delta")
    run = gateway.app.frontdoor.get_run(seen[0]["runId"])
    streams = gateway.app.http.streams if gateway.app.http else set()
    while streams:  # the adapter notices the disconnect and ends its gRPC call
        await asyncio.wait_for(next(iter(streams)).closed.wait(), 5)
    assert not run.done
    gate.set()
    await asyncio.wait_for(run.wait(), 5)
    assert run.log[-1].type == "run.complete"


async def test_a_slow_reader_is_bounded_then_dropped(
    agents_dir: Path, provider: LoopbackProvider
) -> None:
    chunk = "x" * 4000
    provider.enqueue([*(content(chunk) for _ in range(2500)), finish("stop"), DONE])  # ≈ 10 MB
    async with Harness.start(agents_dir, provider, http_write_timeout_s=0.5) as gateway:
        assert gateway.app.http is not None
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", gateway.app.http.port))
        reader, writer = await asyncio.open_connection(sock=sock)
        body = orjson.dumps(QUERY)
        writer.write(
            b"POST /api/query HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        # ...and from now on the client reads nothing.
        stream: EventStream = next(iter(gateway.app.http.streams))
        await asyncio.wait_for(stream.closed.wait(), 30)
        run = next(iter(gateway.app.frontdoor.runs.values()))
        await asyncio.wait_for(run.wait(), 30)
        writer.close()
    total = sum(len(codec.to_json(event)) for event in run.log)
    assert run.log[-1].type == "run.complete"  # the run itself was never held back
    assert stream.end_reason == "write timeout"
    assert stream.sent_bytes < total / 2  # the adapter stopped reading the call...
    assert stream.max_buffered <= 256 * 1024  # ...and its buffer stayed bounded


async def test_queries_refused_while_the_runs_are_full_answer_429_not_a_stream(
    agents_dir: Path, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue([content("held"), Gate(gate), finish("stop"), DONE])
    async with (
        Harness.start(agents_dir, provider, max_concurrent_runs=1) as gateway,
        httpx.AsyncClient(base_url=gateway.http_url, timeout=10) as http,
    ):
        async with httpx_sse.aconnect_sse(http, "POST", "/api/query", json=QUERY) as held:
            events = sse_events(held)
            await read_until(events, "content.delta")
            refused = await asyncio.gather(
                *(
                    http.post("/api/query", json={"agentKey": "plain", "message": f"also {n}"})
                    for n in range(20)
                )
            )
            gate.set()
            rest = [event["type"] async for _, event in events]
        assert gateway.app.frontdoor.active_runs == 0
    assert rest[-1] == "run.complete"
    assert {r.status_code for r in refused} == {429}
    assert {r.headers["Content-Type"].split(";")[0] for r in refused} == {"application/json"}
    for response in refused:
        body = response.json()
        assert {k: v for k, v in body.items() if k != "msg"} == {
            "code": 8,
            "data": None,
            "status": "RESOURCE_EXHAUSTED",
            "reason": "OVERLOADED",
            "metadata": {"limit": "1"},
        }


async def test_a_query_waiting_for_its_chat_is_opened_by_a_heartbeat(
    fast_heartbeat: Harness, provider: LoopbackProvider
) -> None:
    gate = asyncio.Event()
    provider.enqueue(
        [content("first"), Gate(gate), finish("stop"), DONE],
        [content("second"), finish("stop"), DONE],
    )
    async with (
        httpx.AsyncClient(base_url=fast_heartbeat.http_url, timeout=10) as http,
        httpx_sse.aconnect_sse(http, "POST", "/api/query", json=QUERY) as first,
    ):
        head = await read_until(sse_events(first), "content.delta")
        queued = {
            **QUERY,
            "chatId": head[0]["chatId"],
            "multitaskStrategy": "MULTITASK_STRATEGY_ENQUEUE",
        }
        async with http.stream("POST", "/api/query", json=queued) as second:
            assert second.status_code == 200  # accepted while it waits: a heartbeat opened it
            lines = second.aiter_lines()
            assert await anext(lines) == ": heartbeat"
            gate.set()
            data = [json.loads(line[6:]) async for line in lines if line.startswith("data: ")]
    assert [e["type"] for e in data][-3:] == ["content.delta", "content.end", "run.complete"]
    assert data[0]["message"] == "Hi there" and data[0]["chatId"] == head[0]["chatId"]
