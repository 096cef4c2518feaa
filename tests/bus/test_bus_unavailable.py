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
from tests.bus.conftest import rest, started, until
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
        call = a.query("plain", "go")
        on_a: list[Any] = []
        delta = await until(call, "content.delta", on_a)
        following = b.stub.Attach(gw.AttachRequest(run_id=delta.run_id))
        on_b: list[Any] = []
        await until(following, "content.delta", on_b)  # B follows the run through Redis

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
    if outage == "frozen":  # Redis kept its data: B gets the rest, the terminal event once
        assert on_b == on_a
    else:  # Redis lost the run's stream: B ends it, once, and says why
        assert kinds(on_b) == [*HEAD, "content.start", "content.delta", "content.end", "run.error"]
        assert on_b[:5] == on_a[:5]
        assert on_b[-1].run_error.error.reason == "BUS_UNAVAILABLE"
    assert kinds(again) == [*HEAD, *ANSWER]
