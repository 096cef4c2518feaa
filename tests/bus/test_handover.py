"""A draining replica hands its journaled runs over: another one takes each over at once.

On SIGTERM a replica of the Redis run bus stops its runs that can resume elsewhere
(journaled, of an agent that resumes) after its drain delay, and hands each over: its
lease let go and its id queued, so that a replica that is not draining declares it lost
and resumes it at once, not after the lease expired. The clients streaming from the
draining replica get RUN_HANDED_OVER and re-attach anywhere from their last seq; its
followers elsewhere see one run: `run.resume` (reason `drain`) and the rest.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from agw.v1 import gateway_pb2 as gw
from agw_client import AsyncClient, Client

from service.providers.loopback import LoopbackProvider
from tests.bus.conftest import eventually, parked_on, rest, started, until
from tests.bus.test_owner_failure import OPEN, RESUMED, status_of, stream_of
from tests.bus.test_replicas import gated
from tests.core.tools.kit import answer_turn, call_turn, kinds, result_of
from tests.transport.test_query import error_info
from tests.transport.test_server import assert_closed

LEASE_S = 10.0  # long: a hand-over that waited for the lease to expire would show


async def test_a_draining_replica_hands_its_run_over_and_another_takes_it_at_once(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    script, (first,) = gated("w0 ", "w1")
    provider.enqueue(script, answer_turn("fresh ", "answer"))
    async with started(
        tmp_path, provider, redis_url, lease_ttl_s=LEASE_S, journal=True
    ) as replicas:
        a, b = replicas["A"], replicas["B"]
        call = a.query("plain", "go")
        on_a: list[Any] = []
        delta = await until(call, "content.delta", on_a)
        run_id = delta.run_id
        following = b.stub.Attach(gw.AttachRequest(run_id=run_id))
        on_b: list[Any] = []
        await until(following, "content.delta", on_b)
        began = time.monotonic()
        stopping = asyncio.create_task(a.server.stop(30.0, 0.0))  # SIGTERM, no delay
        with pytest.raises(grpc.aio.AioRpcError) as moved:
            async for event in call:
                on_a.append(event)
        on_b += await rest(following)
        took = time.monotonic() - began
        await stopping
        again = await b.attach(run_id, on_a[-1].seq)  # where A's client goes on
        first.set()
    assert moved.value.code() == grpc.StatusCode.UNAVAILABLE
    info = error_info(moved.value)
    assert info.reason == "RUN_HANDED_OVER"
    assert dict(info.metadata) == {"run_id": run_id, "after_seq": str(on_a[-1].seq)}
    assert on_a == on_b[: len(on_a)] and kinds(on_a) == OPEN
    assert kinds(on_b) == RESUMED  # the interrupted turn's block closed first
    resume = on_b[len(OPEN) + 1].run_resume
    assert (resume.reason, resume.attempt, resume.step) == ("drain", 1, "turn 1")
    assert resume.replica in ("B", "C")
    assert took < LEASE_S / 2, took  # taken over at once, not once A's lease expired
    assert [*on_a, *again] == on_b
    assert_closed(on_b)
    assert await stream_of(redis_url, run_id) == on_b
    assert await status_of(redis_url, run_id) == "ended"


async def test_a_run_handed_over_more_often_than_its_resume_attempts_still_completes(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    """A rolling restart moves a run as often as it takes: a hand-over is not a loss of its
    process, so it does not count against AGW_RESUME_ATTEMPTS (3 here)."""
    names = ("A", "B", "C", "D", "E", "F")
    turns = [gated(f"t{n} ", "end") for n in range(5)]
    provider.enqueue(*(script for script, _ in turns))
    async with started(
        tmp_path, provider, redis_url, names, lease_ttl_s=LEASE_S, journal=True
    ) as replicas:
        call = replicas["A"].query("plain", "go")
        seen: list[Any] = []
        run_id = (await until(call, "content.delta", seen)).run_id
        owner, stopped = "A", set()
        for n in range(4):  # the owner drains, another one resumes the run: four times
            await replicas[owner].server.stop(30.0, 0.0)
            stopped.add(owner)
            watch = next(r for name, r in replicas.members.items() if name not in stopped)
            following = watch.stub.Attach(gw.AttachRequest(run_id=run_id, after_seq=seen[-1].seq))
            resumed = await until(following, "run.resume", seen)
            owner = resumed.run_resume.replica
            await until(following, "content.delta", seen)
            following.cancel()
            assert resumed.run_resume.attempt == n + 1
        turns[4][1][0].set()
        seen += await replicas[owner].attach(run_id, seen[-1].seq)
        for _, gates in turns[:4]:
            gates[0].set()
    resumes = [e.run_resume for e in seen if e.type == "run.resume"]
    assert [(r.reason, r.attempt) for r in resumes] == [("drain", n) for n in (1, 2, 3, 4)]
    assert len({r.replica for r in resumes}) == 4 and "A" not in {r.replica for r in resumes}
    assert seen[-1].type == "run.complete"
    assert_closed(seen)
    assert await stream_of(redis_url, run_id) == seen


async def test_with_no_other_replica_up_a_draining_one_lets_its_runs_finish_in_the_grace(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    """A run handed over with nobody to take it would wait for a replica to start: when the
    others are gone (or drain too, as when the whole service stops), the runs keep their
    grace period and end as usual."""
    script, (first,) = gated("w0 ", "w1")
    provider.enqueue(script)
    async with started(
        tmp_path, provider, redis_url, ("A", "B"), lease_ttl_s=LEASE_S, journal=True
    ) as replicas:
        a = replicas["A"]
        call = a.query("plain", "go")
        seen: list[Any] = []
        await until(call, "content.delta", seen)
        await replicas["B"].server.stop(30.0, 0.0)
        stopping = asyncio.create_task(a.server.stop(30.0, 0.0))
        await asyncio.sleep(0.5)  # past the drain delay: nothing was handed over
        first.set()
        seen += await rest(call)
        await stopping
    assert kinds(seen) == [*OPEN, "content.delta", "content.end", "run.complete"]
    assert_closed(seen)


# The official clients follow a hand-over: the caller sees one stream ------------------------

ROOT = Path(__file__).resolve().parents[2]
#: A Node client (the repository's) streaming a query, each event a JSON line, then a last
#: line with how often the stream re-attached.
NODE_FOLLOWER = """
const { AgwClient } = require('./clients/node');
(async () => {
  const agw = new AgwClient(process.env.AGW_TARGET);
  const stream = agw.query('plain', 'go');
  for await (const e of stream) console.log(JSON.stringify({ seq: e.seq, type: e.type }));
  console.log(JSON.stringify({ reattached: stream.reattached }));
  agw.close();
})().catch((error) => { console.error(error); process.exit(1); });
"""


def _both(replicas: Any, first: str, then: str) -> str:
    """One target for two replicas: the client's channel uses `first` while it is up."""
    return f"ipv4:127.0.0.1:{replicas[first].port},127.0.0.1:{replicas[then].port}"


def _resumed(events: list[Any]) -> None:
    """`events` are one run, handed over once after its first delta: resumed, complete."""
    assert kinds(events) == RESUMED
    assert events[len(OPEN) + 1].run_resume.reason == "drain"
    assert_closed(events)


async def test_the_async_python_client_follows_a_hand_over_through_the_same_target(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    script, (first,) = gated("w0 ", "w1")
    provider.enqueue(script, answer_turn("fresh ", "answer"))
    async with started(tmp_path, provider, redis_url, ("A", "B"), journal=True) as replicas:
        async with AsyncClient(_both(replicas, "A", "B")) as agw:
            stream = agw.query("plain", "go")
            seen: list[Any] = []
            stopping = None
            async for event in stream:
                seen.append(event)
                if event.type == "content.delta" and stopping is None:
                    stopping = asyncio.create_task(replicas["A"].server.stop(30.0, 0.0))
            assert stopping is not None
            await stopping
        first.set()
        run_id = seen[0].run_id
        assert await stream_of(redis_url, run_id) == seen
    _resumed(seen)
    assert stream.reattached >= 1
    assert stream.folder.result.answer == "fresh answer"


async def test_the_blocking_python_client_follows_a_hand_over_through_the_same_target(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    script, (first,) = gated("w0 ", "w1")
    provider.enqueue(script, answer_turn("fresh ", "answer"))
    loop = asyncio.get_running_loop()
    async with started(tmp_path, provider, redis_url, ("A", "B"), journal=True) as replicas:
        stopping: list[Any] = []

        def follow() -> tuple[list[Any], int]:
            with Client(_both(replicas, "A", "B")) as agw, agw.query("plain", "go") as stream:
                seen = []
                for event in stream:
                    seen.append(event)
                    if event.type == "content.delta" and not stopping:
                        stop = replicas["A"].server.stop(30.0, 0.0)
                        stopping.append(asyncio.run_coroutine_threadsafe(stop, loop))
                return seen, stream.reattached

        seen, reattached = await asyncio.to_thread(follow)
        await asyncio.wrap_future(stopping[0])
        first.set()
        assert await stream_of(redis_url, seen[0].run_id) == seen
    _resumed(seen)
    assert reattached >= 1


async def test_the_node_client_follows_a_hand_over_through_the_same_target(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    node = shutil.which("node")
    assert node, "Node.js is needed for the Node client's tests"
    script, (first,) = gated("w0 ", "w1")
    provider.enqueue(script, answer_turn("fresh ", "answer"))
    async with started(tmp_path, provider, redis_url, ("A", "B"), journal=True) as replicas:
        process = await asyncio.create_subprocess_exec(
            node,
            "-e",
            NODE_FOLLOWER,
            cwd=ROOT,
            env={**os.environ, "AGW_TARGET": _both(replicas, "A", "B")},
            stdout=asyncio.subprocess.PIPE,
        )
        assert process.stdout is not None
        lines = []
        async with asyncio.timeout(60):
            async for line in process.stdout:
                lines.append(json.loads(line))
                if lines[-1].get("type") == "content.delta" and len(lines) == len(OPEN):
                    await replicas["A"].server.stop(30.0, 0.0)
            assert await process.wait() == 0
        first.set()
    *events, last = lines
    assert [e["type"] for e in events] == RESUMED
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert last["reattached"] >= 1


async def test_a_query_refused_by_a_draining_replica_is_sent_again_and_runs_on_another(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    """While a replica drains (its drain delay, here with a run to hand over) it refuses new
    queries UNAVAILABLE SHUTTING_DOWN, nothing started: the client sends the query again
    through the same target, which reaches another replica once the draining one is gone."""
    script, (first,) = gated("w0 ", "w1")
    provider.enqueue(script, answer_turn("fresh ", "answer"), answer_turn("second"))
    async with started(tmp_path, provider, redis_url, ("A", "B"), journal=True) as replicas:
        a = replicas["A"]
        running = a.query("plain", "go")
        await until(running, "content.delta", [])
        stopping = asyncio.create_task(a.server.stop(30.0, 1.0))  # 1 s before the hand-over
        await asyncio.sleep(0.1)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await a.ask("plain", "now")
        async with AsyncClient(_both(replicas, "A", "B")) as agw:
            stream = agw.query("plain", "now")
            result = await stream.result()
        await stopping
        first.set()
    assert error_info(refused.value).reason == "SHUTTING_DOWN"
    assert result.outcome == "complete"
    assert stream.reattached >= 1
    assert await status_of(redis_url, stream.run_id) == "ended"


async def test_a_parked_run_is_handed_over_at_a_drain_and_parked_again_where_it_is_taken(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    """A parked run (no task, waiting for an answer) on a draining replica is handed over
    too: another replica takes it over at once (not after A's lease), parks it again at once,
    and an answer sent to any replica wakes it there."""
    provider.enqueue(call_turn(("call_f", "pick", '{"options":["a","b"]}')), answer_turn("a"))
    async with started(
        tmp_path, provider, redis_url, lease_ttl_s=LEASE_S, journal=True, park_after_s=0.05
    ) as replicas:
        a = replicas["A"]
        call = a.query("ui", "Choose")
        seen: list[Any] = []
        end = await until(call, "tool.end", seen)
        run_id, tool_id = end.run_id, end.tool_end.tool_id

        await eventually(parked_on(replicas, "A"))
        began = time.monotonic()
        stopping = asyncio.create_task(a.server.stop(30.0, 0.0))
        with pytest.raises(grpc.aio.AioRpcError) as moved:
            async for event in call:
                seen.append(event)
        await eventually(parked_on(replicas, "B", "C"), timeout_s=LEASE_S)
        took = time.monotonic() - began
        await stopping
        adopter = next(n for n in "BC" if replicas[n].front.lifecycle.parked_runs)
        other = next(n for n in "BC" if n != adopter)
        payload = gw.SubmitRequest(run_id=run_id, tool_id=tool_id)
        payload.payload.string_value = "b"
        assert (await replicas[other].stub.Submit(payload)).accepted
        whole = await rest(replicas[other].stub.Attach(gw.AttachRequest(run_id=run_id)))
    assert error_info(moved.value).reason == "RUN_HANDED_OVER"
    assert error_info(moved.value).metadata["after_seq"] == str(seen[-1].seq)
    assert took < LEASE_S / 2, took  # taken over at once, not once A's lease expired
    assert whole[: len(seen)] == seen
    assert kinds(whole)[len(seen) :] == [
        "run.resume",
        "request.submit",
        "tool.result",
        "content.start",
        "content.delta",
        "content.end",
        "run.complete",
    ]
    resume = whole[len(seen)].run_resume
    assert (resume.reason, resume.replica, resume.attempt) == ("drain", adopter, 1)
    assert result_of(whole[len(seen) + 2]) == "b"
    assert_closed(whole)


async def test_a_stream_following_a_run_its_replica_took_over_ends_handed_over_at_its_stop(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    """A stream on B follows A's run; A drains and B takes the run over (while the stream is
    open), then B drains and C takes it: the stream ends RUN_HANDED_OVER with its last seq
    as B stops, and its client goes on from there on C."""
    script, (first,) = gated("w0 ", "w1")
    then, (second,) = gated("x0 ", "x1")
    provider.enqueue(script, then, answer_turn("again"))
    async with started(
        tmp_path, provider, redis_url, lease_ttl_s=LEASE_S, journal=True
    ) as replicas:
        a, b, c = replicas["A"], replicas["B"], replicas["C"]
        call = a.query("plain", "go")
        run_id = (await until(call, "content.delta", [])).run_id
        following = b.stub.Attach(gw.AttachRequest(run_id=run_id))
        on_b: list[Any] = []
        await until(following, "content.delta", on_b)
        c.bus.leases.draining = True  # C takes nothing over for now: B takes the run
        await a.server.stop(30.0, 0.0)
        resumed = await until(following, "run.resume", on_b)
        assert resumed.run_resume.replica == "B"
        await until(following, "content.delta", on_b)
        c.bus.leases.draining = False
        began = time.monotonic()
        stopping = asyncio.create_task(b.server.stop(30.0, 0.0))
        with pytest.raises(grpc.aio.AioRpcError) as moved:
            async for event in following:
                on_b.append(event)
        took = time.monotonic() - began
        await stopping
        first.set()
        second.set()
        rest_on_c = await c.attach(run_id, on_b[-1].seq)
    assert error_info(moved.value).reason == "RUN_HANDED_OVER"
    assert error_info(moved.value).metadata["after_seq"] == str(on_b[-1].seq)
    assert took < 1.5, took  # ended by the stop, not cut after its grace (STREAMS_END_S)
    whole = [*on_b, *rest_on_c]
    assert [e.seq for e in whole] == list(range(1, len(whole) + 1))
    resumes = [e.run_resume for e in whole if e.type == "run.resume"]
    assert [(r.reason, r.replica) for r in resumes] == [("drain", "B"), ("drain", "C")]
    assert whole[-1].type == "run.complete"
    assert_closed(whole)
