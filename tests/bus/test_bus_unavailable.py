"""Redis unreachable: calls needing it are refused UNAVAILABLE / BUS_UNAVAILABLE at once,
runs in flight end with one terminal event everywhere, and service resumes with Redis.

Each test has a Redis server of its own, frozen (`SIGSTOP`: no answer) or stopped
(connections refused) in the middle of the test.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from agw.v1 import gateway_pb2 as gw

from service.providers.loopback import LoopbackProvider
from service.testing import RedisServer, redis_binary
from tests.bus.conftest import Replica, rest, started, until
from tests.bus.test_replicas import ANSWER, HEAD, gated
from tests.core.tools.kit import answer_turn, kinds
from tests.transport.test_query import error_info

REPLY_TIMEOUT_S = 1.0


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = RedisServer.start()
    with server:
        yield server


def signal_redis(server: RedisServer, sig: signal.Signals) -> None:
    assert server.process is not None
    os.kill(server.process.pid, sig)


async def refused_unavailable(call: Any) -> tuple[grpc.aio.AioRpcError, float]:
    """The error `call()` is refused with, and how long that took."""
    began = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call()
    return caught.value, time.monotonic() - began


def assert_bus_unavailable(error: grpc.aio.AioRpcError) -> None:
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    info = error_info(error)
    assert info.reason == "BUS_UNAVAILABLE"
    assert "run bus (Redis) is unreachable" in error.details()


async def followed(a: Replica, b: Replica, message: str) -> tuple[Any, ...]:
    """A run streaming on A (held after its first delta), followed on B through Redis: its
    call, the events A sent so far, its first delta, B's call and the events B sent."""
    call = a.query("plain", message)
    on_a: list[Any] = []
    delta = await until(call, "content.delta", on_a)
    following = b.stub.Attach(gw.AttachRequest(run_id=delta.run_id))
    on_b: list[Any] = []
    await until(following, "content.delta", on_b)
    return call, on_a, delta, following, on_b


@pytest.mark.parametrize("outage", ["frozen", "restarted empty"])
async def test_an_unreachable_redis_refuses_calls_promptly_and_runs_end_once(
    tmp_path: Path, provider: LoopbackProvider, own_redis: RedisServer, outage: str
) -> None:
    script, (gate,) = gated("w0 ", "w1")
    provider.enqueue(script, answer_turn("back"))
    restarted: RedisServer | None = None
    async with started(
        tmp_path,
        provider,
        own_redis.url,
        ("A", "B"),
        lease_ttl_s=8.0,  # the outage is no owner failure
        reply_timeout_s=REPLY_TIMEOUT_S,
    ) as replicas:
        a, b = replicas["A"], replicas["B"]
        call, on_a, delta, following, on_b = await followed(a, b, "go")

        if outage == "frozen":  # no answer at all: the calls time out
            signal_redis(own_redis, signal.SIGSTOP)
        else:  # connections refused
            own_redis.stop()
        try:
            calls = {
                "Query": lambda: a.ask("plain", "new chat"),
                "Attach": lambda: b.attach("0123456789abcdef"),
                "Cancel": lambda: b.stub.Cancel(gw.CancelRequest(run_id=delta.run_id)),
            }
            for name, refused_call in calls.items():
                error, took = await refused_unavailable(refused_call)
                assert_bus_unavailable(error)
                assert took < REPLY_TIMEOUT_S + 2.0, (name, took)
            # The chat's history is still read; its live run cannot be told meanwhile.
            chat = await b.stub.GetChat(gw.GetChatRequest(chat_id=delta.chat_id))
            assert chat.events[0].type == "request.query" and not chat.HasField("live_run")
            gate.set()  # the run goes on and ends on its owner
            on_a += await rest(call)
        finally:
            if outage == "frozen":
                signal_redis(own_redis, signal.SIGCONT)
            else:
                restarted = RedisServer._start(redis_binary(), own_redis.port)
        try:
            on_b += await rest(following)
            again = await a.ask("plain", "after")  # served again
        finally:
            if restarted is not None:
                restarted.stop()
    assert kinds(on_a) == [*HEAD, "content.start", "content.delta", "content.delta", *ANSWER[2:]]
    # Redis kept its data, or its owner re-asserted the run and appended its whole stream
    # again: B gets the rest, the terminal event once.
    assert on_b == on_a
    assert kinds(again) == [*HEAD, *ANSWER]


async def test_a_redis_restarted_empty_keeps_a_running_chat_busy_on_every_replica(
    tmp_path: Path, provider: LoopbackProvider, own_redis: RedisServer
) -> None:
    script, (gate,) = gated("w0 ", "w1")
    provider.enqueue(script, answer_turn("after"))
    restarted: RedisServer | None = None
    async with started(
        tmp_path, provider, own_redis.url, ("A", "B"), lease_ttl_s=3.0, reply_timeout_s=1.0
    ) as replicas:
        a, b = replicas["A"], replicas["B"]
        call = a.query("plain", "first")
        on_a: list[Any] = []
        delta = await until(call, "content.delta", on_a)
        chat_id = delta.chat_id
        own_redis.stop(signal.SIGKILL)  # killed: every claim and lease gone with it
        try:
            restarted = RedisServer._start(redis_binary(), own_redis.port)  # empty, same port
            refusals = {}
            for name, replica in (("B", b), ("A", a)):
                began = time.monotonic()
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await rest(replica.query("plain", "second", chat_id=chat_id), timeout_s=8.0)
                refusals[name] = (caught.value, time.monotonic() - began)
            gate.set()
            on_a += await rest(call)
            await a.front.flush()
            after = await b.ask("plain", "third", chat_id=chat_id)
            await b.front.flush()
            chat = await a.stub.GetChat(gw.GetChatRequest(chat_id=chat_id))
        finally:
            if restarted is not None:
                restarted.stop()
    for name, (error, took) in refusals.items():
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, (name, error)
        info = error_info(error)
        assert (info.reason, info.metadata["run_id"]) == ("CHAT_BUSY", delta.run_id), name
        assert took < 3.0 + 1.0, (name, took)  # at most the lease, owners' time to re-assert
    assert refusals["A"][1] < 0.5  # its owner knows its own run
    assert kinds(on_a) == [*HEAD, "content.start", "content.delta", "content.delta", *ANSWER[2:]]
    assert kinds(after) == ["request.query", "run.start", *ANSWER]
    done = ["content.snapshot", "run.complete"]
    assert [(e.run_id, e.type) for e in chat.events] == [
        *[(delta.run_id, kind) for kind in [*HEAD, *done]],
        *[(after[0].run_id, kind) for kind in ["request.query", "run.start", *done]],
    ]
    assert provider.requests[-1]["messages"][1:] == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "w0 w1"},
        {"role": "user", "content": "third"},
    ]


async def test_a_run_nobody_re_asserts_after_redis_restarted_empty_ends_for_its_followers(
    tmp_path: Path, provider: LoopbackProvider, own_redis: RedisServer
) -> None:
    lease_s = 2.0
    script, (gate,) = gated("w0 ", "w1")
    provider.enqueue(script)
    restarted: RedisServer | None = None
    async with started(
        tmp_path, provider, own_redis.url, ("A", "B"), lease_ttl_s=lease_s, reply_timeout_s=1.0
    ) as replicas:
        a, b = replicas["A"], replicas["B"]
        call, on_a, _delta, following, on_b = await followed(a, b, "first")
        a.bus.suspend()  # its owner writes nothing to Redis any more (as if it hung)
        own_redis.stop(signal.SIGKILL)
        try:
            restarted = RedisServer._start(redis_binary(), own_redis.port)
            began = time.monotonic()
            on_b += await rest(following)
            waited = time.monotonic() - began
            a.bus.resume()
            gate.set()
            on_a += await rest(call)
        finally:
            if restarted is not None:
                restarted.stop()
    assert kinds(on_b) == [*HEAD, "content.start", "content.delta", "content.end", "run.error"]
    assert on_b[-1].run_error.error.reason == "BUS_UNAVAILABLE"
    assert lease_s <= waited < lease_s + 2.0  # the owners' time to re-assert, then ended
    assert kinds(on_a) == [*HEAD, "content.start", "content.delta", "content.delta", *ANSWER[2:]]


async def test_a_run_whose_keys_redis_dropped_is_re_asserted_by_its_owner(
    tmp_path: Path, provider: LoopbackProvider, own_redis: RedisServer
) -> None:
    script, (gate,) = gated("w0 ", "w1")
    provider.enqueue(script)
    async with started(tmp_path, provider, own_redis.url, ("A", "B"), lease_ttl_s=8.0) as replicas:
        a, b = replicas["A"], replicas["B"]
        call, on_a, delta, following, on_b = await followed(a, b, "first")
        keys = a.bus.keys  # dropped one by one (as by an eviction): the epoch stays
        dropped = [keys.meta(delta.run_id), keys.events(delta.run_id), keys.lease(delta.run_id)]
        dropped.append(keys.claim(delta.chat_id))
        assert own_redis.command("DEL", *dropped) == b":4"
        gate.set()  # its next append finds the run gone: its owner re-asserts it
        on_a += await rest(call)
        on_b += await rest(following)
        stream = own_redis.command("XLEN", keys.events(delta.run_id))
    assert kinds(on_a) == [*HEAD, "content.start", "content.delta", "content.delta", *ANSWER[2:]]
    assert on_b == on_a
    assert stream == b":%d" % len(on_a)  # the run's stream is whole again
