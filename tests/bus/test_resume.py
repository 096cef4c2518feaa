"""A journaled run whose owner is lost resumes on another replica: one run, no gap.

The replicas share one journal (as they do in PostgreSQL) and one Redis. When the
owner stops renewing its lease, the replica that declares it lost takes the run over
(fenced: exactly one does) and resumes it from its journal: its stream, in Redis, goes
on under the same run id with the next seq — the open block closed, `run.resume`, the
interrupted model turn asked again — and every follower on every replica sees one run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from agw.v1 import gateway_pb2 as gw

from service.providers.loopback import LoopbackProvider
from tests.bus.conftest import eventually, parked_on, rest, started, until
from tests.bus.test_owner_failure import OPEN, RESUMED, status_of, stream_of
from tests.bus.test_replicas import gated
from tests.core.tools.kit import answer_turn, call_turn, kinds, result_of
from tests.transport.test_server import assert_closed


async def test_a_run_whose_owner_is_lost_resumes_on_another_replica(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    script, (first,) = gated("w0 ", "w1")
    provider.enqueue(script, answer_turn("fresh ", "answer"))
    async with started(tmp_path, provider, redis_url, lease_ttl_s=0.6, journal=True) as replicas:
        a, b = replicas["A"], replicas["B"]
        call = a.query("plain", "go")
        on_a: list[Any] = []
        delta = await until(call, "content.delta", on_a)
        run_id = delta.run_id
        following = b.stub.Attach(gw.AttachRequest(run_id=run_id))
        on_b: list[Any] = []
        await until(following, "content.delta", on_b)  # B reads w0 from Redis
        a.bus.suspend()  # A freezes for Redis: its lease expires, another replica takes over
        on_b += await rest(following)
        first.set()  # too late for A: the run is no longer its own
        a.bus.resume()
        await asyncio.sleep(0.1)
    assert kinds(on_b) == RESUMED  # the interrupted turn's block closed first
    resume = on_b[len(OPEN) + 1].run_resume
    assert (resume.reason, resume.attempt) == ("owner_lost", 1)
    assert resume.replica in ("B", "C")
    fresh = on_b[len(OPEN) + 2].content_start.content_id
    assert fresh == f"{run_id}_c_2"  # a new block: the old one was closed
    assert_closed(on_b)
    asked, again = provider.requests
    assert again["messages"] == asked["messages"]  # the turn asked again, as it was
    assert await stream_of(redis_url, run_id) == on_b  # one stream, seqs 1, 2, 3, …
    assert await status_of(redis_url, run_id) == "ended"


async def test_a_tool_call_that_began_on_the_lost_owner_is_answered_interrupted(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    """A backend tool that is not idempotent is not run twice: the model is told."""
    agents = {
        "slow": {
            "mode": "REACT",
            "react": {"systemPrompt": "Act."},
            "toolConfig": {"backends": ["forever"]},
        }
    }
    provider.enqueue(
        call_turn(("c1", "forever", "{}")),
        answer_turn("it was interrupted"),
    )
    async with started(
        tmp_path, provider, redis_url, lease_ttl_s=0.6, journal=True, agents=agents
    ) as replicas:
        a, b = replicas["A"], replicas["B"]
        call = a.query("slow", "go")
        on_a: list[Any] = []
        started_tool = await until(call, "tool.end", on_a)
        run_id = started_tool.run_id
        following = b.stub.Attach(gw.AttachRequest(run_id=run_id))
        on_b = [e async for e in _until_seq(following, started_tool.seq)]
        await asyncio.sleep(0.2)  # the tool runs on A
        a.bus.suspend()
        on_b += await rest(following)
        a.bus.resume()
    resumed = kinds(on_b).index("run.resume")
    assert kinds(on_b)[resumed:] == [
        "run.resume",
        "tool.result",
        "content.start",
        "content.delta",
        "content.end",
        "run.complete",
    ]
    assert on_b[resumed].run_resume.step == "tool c1"
    result = on_b[resumed + 1]
    assert result.tool_result.error
    assert "interrupted" in result_of(result)
    assert_closed(on_b)


async def _until_seq(call: Any, seq: int) -> Any:
    async for event in call:
        yield event
        if event.seq >= seq:
            return


@pytest.mark.parametrize("kept_in", ["process", "postgres"])
async def test_a_journaled_run_is_followed_and_answered_from_another_replica(
    tmp_path: Path,
    provider: LoopbackProvider,
    redis_url: str,
    request: pytest.FixtureRequest,
    kept_in: str,
) -> None:
    """Journaled, a run's events reach the other replicas once durable: B follows it whole,
    through the wait C's Submit answers."""
    provider.enqueue(call_turn(("call_f", "pick", '{"options":["a","b"]}')), answer_turn("a"))
    journal = request.getfixturevalue("postgres_dsn") if kept_in == "postgres" else True
    async with started(tmp_path, provider, redis_url, journal=journal) as replicas:
        a, b, c = replicas["A"], replicas["B"], replicas["C"]
        call = a.query("ui", "Choose")
        seen: list[Any] = []
        end = await until(call, "tool.end", seen)
        run_id, tool_id = end.run_id, end.tool_end.tool_id
        following = b.stub.Attach(gw.AttachRequest(run_id=run_id))
        followed: list[Any] = []
        await until(following, "tool.end", followed)
        payload = gw.SubmitRequest(run_id=run_id, tool_id=tool_id)
        payload.payload.string_value = "b"
        assert (await c.stub.Submit(payload)).accepted
        seen += await rest(call)
        followed += await rest(following)
    assert kinds(followed) == kinds(seen)
    assert followed == seen
    assert kinds(seen)[-2:] == ["content.end", "run.complete"]


async def test_a_parked_run_outlives_its_owner_and_wakes_where_it_was_adopted(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    """A run parked on A (no task, only waiting) whose owner is lost is adopted by another
    replica, parked there again at once, and woken there by a Submit sent to a third."""
    provider.enqueue(call_turn(("call_f", "pick", '{"options":["a","b"]}')), answer_turn("a"))
    async with started(
        tmp_path, provider, redis_url, lease_ttl_s=0.6, journal=True, park_after_s=0.05
    ) as replicas:
        a = replicas["A"]
        call = a.query("ui", "Choose")
        seen: list[Any] = []
        end = await until(call, "tool.end", seen)
        run_id, tool_id = end.run_id, end.tool_end.tool_id

        await eventually(parked_on(replicas, "A"))
        a.bus.suspend()  # A is lost: another replica adopts the parked run
        await eventually(parked_on(replicas, "B", "C"), timeout_s=15)
        adopter = next(n for n in "BC" if replicas[n].front.lifecycle.parked_runs)
        other = next(n for n in "BC" if n != adopter)
        payload = gw.SubmitRequest(run_id=run_id, tool_id=tool_id)
        payload.payload.string_value = "b"
        assert (await replicas[other].stub.Submit(payload)).accepted
        whole = await rest(replicas[other].stub.Attach(gw.AttachRequest(run_id=run_id)))
        a.bus.resume()
    tail = kinds(whole)[len(seen) :]
    assert tail == [
        "run.resume",
        "request.submit",
        "tool.result",
        "content.start",
        "content.delta",
        "content.end",
        "run.complete",
    ]
    assert whole[: len(seen)] == seen
    resume = whole[len(seen)].run_resume
    assert (resume.reason, resume.replica, resume.step) == (
        "owner_lost",
        adopter,
        f"wait {tool_id}",
    )
    assert result_of(whole[len(seen) + 2]) == "b"
    assert_closed(whole)
