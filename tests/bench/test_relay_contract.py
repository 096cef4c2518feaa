"""The contract relay (`relay-contract`): the events of a run's stream, in order, one envelope."""

from __future__ import annotations

from typing import cast

import grpc
import pytest
from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw

from bench.baseline import start_grpc
from bench.load import Target
from bench.protocol import AGENT_KEY, StreamSpec
from bench.provider import bench_provider
from bench.relay import ContractRelay

OPENING = ["request.query", "chat.start", "run.start"]


@pytest.mark.parametrize(
    ("deltas", "types"),
    [
        (1, [*OPENING, "content.start", "content.delta", "content.end", "run.complete"]),
        (3, [*OPENING, "content.start", *["content.delta"] * 3, "content.end", "run.complete"]),
        (0, [*OPENING, "run.complete"]),  # no content block without a delta
    ],
)
async def test_writes_the_contract_events_around_the_deltas(deltas: int, types: list[str]) -> None:
    async with bench_provider() as provider:
        relay = ContractRelay(provider.url, 4)
        await relay.start()
        server, port = await start_grpc(relay.Query)
        target = Target("relay-contract", port, channels=1)
        try:
            events = await _read(target, StreamSpec(deltas))
        finally:
            await target.close()
            await server.stop(None)
            await relay.aclose()

    assert [e.type for e in events] == types
    assert [e.WhichOneof("payload") for e in events] == [t.replace(".", "_") for t in types]
    assert [e.seq for e in events] == list(range(1, len(types) + 1))
    assert len({(e.chat_id, e.run_id) for e in events}) == 1
    blocks = {e.content_start.content_id for e in events if e.type == "content.start"}
    blocks |= {e.content_delta.content_id for e in events if e.type == "content.delta"}
    blocks |= {e.content_end.content_id for e in events if e.type == "content.end"}
    assert blocks == ({f"{events[0].run_id}_c_1"} if deltas else set())


async def _read(target: Target, spec: StreamSpec) -> list[pb.Event]:
    """Every event of the stream, to its end."""
    call = target.stub().Query(gw.QueryRequest(agent_key=AGENT_KEY, message=spec.to_message()))
    events: list[pb.Event] = []
    while (read := await call.read()) is not grpc.aio.EOF:
        events.append(cast(pb.Event, read))
    return events
