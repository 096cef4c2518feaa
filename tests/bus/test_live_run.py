"""GetChat's `live_run` on three replicas: any replica tells a run's last seq and its waits."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from agw.v1 import gateway_pb2 as gw

from service.providers.loopback import LoopbackProvider
from tests.bus.conftest import Replica, rest, started, until
from tests.bus.test_replicas import value
from tests.core.tools.kit import answer_turn, call_turn, kinds


async def live_run(replica: Replica, chat_id: str) -> gw.LiveRun | None:
    chat = await replica.stub.GetChat(gw.GetChatRequest(chat_id=chat_id))
    return chat.live_run if chat.HasField("live_run") else None


async def settled_view(replica: Replica, chat_id: str, count: int) -> gw.LiveRun:
    """The chat's live run once it shows `count` waits."""
    async with asyncio.timeout(10):
        while True:
            live = await live_run(replica, chat_id)
            if live is not None and len(live.waits) == count:
                return live
            await asyncio.sleep(0.01)


async def test_every_replica_sees_the_live_run_of_a_and_its_waits(
    tmp_path: Path, provider: LoopbackProvider, redis_url: str
) -> None:
    provider.enqueue(
        call_turn(("call_1", "pick", '{"options":["a"]}'), ("call_2", "pick", '{"options":["b"]}')),
        answer_turn("done"),
    )
    async with started(tmp_path, provider, redis_url) as replicas:
        a, b, c = replicas["A"], replicas["B"], replicas["C"]
        call = a.query("ui", "Choose twice")
        events: list[Any] = []
        first = await until(call, "tool.end", events)
        second = await until(call, "tool.end", events)
        chat_id, run_id = first.chat_id, first.run_id
        tools = [first.tool_end.tool_id, second.tool_end.tool_id]
        expected = [(tool, gw.WAIT_KIND_FRONTEND_TOOL, "pick") for tool in tools]
        for replica in (a, b, c):  # the owner from memory, the others from Redis
            live = await settled_view(replica, chat_id, 2)
            assert (live.run_id, live.agent_key, live.last_seq) == (run_id, "ui", second.seq)
            assert [(w.tool_id, w.kind, w.tool_name) for w in live.waits] == expected
        assert b.bus.local(run_id) is None
        request = gw.SubmitRequest(run_id=run_id, tool_id=tools[0], payload=value("a"))
        assert (await c.stub.Submit(request)).accepted
        live = await settled_view(b, chat_id, 1)  # the answered wait is closed
        assert [w.tool_id for w in live.waits] == [tools[1]]
        request = gw.SubmitRequest(run_id=run_id, tool_id=tools[1], payload=value("b"))
        assert (await b.stub.Submit(request)).accepted
        events += await rest(call)
        for replica in (a, b, c):
            assert await live_run(replica, chat_id) is None  # ended: nothing live
    assert kinds(events)[-1] == "run.complete"
