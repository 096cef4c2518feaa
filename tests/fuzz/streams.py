"""Streaming calls in their own tasks: opened, followed, and ended by cancelling their runs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from agw.v1 import events_pb2 as pb
from agw.v1 import gateway_pb2 as gw

from tests.fuzz.calls import METHODS, Metadata, Outcome, cancel, check_stream, invoke
from tests.fuzz.kit import FuzzService


@dataclass
class Stream:
    """A streaming call (`method`: Query or Attach) of `owner`'s run, in its own task."""

    method: str
    owner: str
    task: asyncio.Task[Outcome]
    events: list[pb.Event]
    first: asyncio.Event  # set by the first event
    after_seq: int = 0

    @property
    def run_id(self) -> str:
        return self.events[0].run_id if self.events else ""

    @property
    def chat_id(self) -> str:
        return self.events[0].chat_id if self.events else ""

    def waiting_tools(self) -> list[str]:
        return [
            e.tool_end.tool_id
            for e in self.events
            if e.type == "tool.end" and e.tool_end.tool_id.startswith("t_")
        ]

    def check(self) -> None:
        check_stream(METHODS[self.method], self.task.result(), self.after_seq)


def open_stream(
    service: FuzzService,
    request: gw.QueryRequest | gw.AttachRequest,
    owner: str,
    metadata: Metadata,
) -> Stream:
    """Start the call of `request` (Query or Attach) in a task, keeping its events as they come."""
    events: list[pb.Event] = []
    first = asyncio.Event()
    method = "Query" if isinstance(request, gw.QueryRequest) else "Attach"

    async def keep(event: pb.Event) -> None:
        events.append(event)
        first.set()

    call = invoke(service, METHODS[method], request.SerializeToString(), metadata, keep)
    after = request.after_seq if isinstance(request, gw.AttachRequest) else 0
    return Stream(method, owner, asyncio.create_task(call), events, first, after)


async def started(stream: Stream) -> None:
    """Until the stream's run has started (or the call has ended)."""
    first = asyncio.ensure_future(stream.first.wait())
    try:
        await asyncio.wait({first, stream.task}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    finally:
        first.cancel()
    assert stream.events or stream.task.done(), "a Query said nothing for 10 s"


async def end_all(service: FuzzService, streams: list[Stream]) -> None:
    """Cancel the runs of `streams` (each by its owner) until every stream has ended."""
    async with asyncio.timeout(30):
        while not all(s.task.done() for s in streams):
            for stream in streams:
                if stream.run_id and not stream.task.done():
                    await cancel(service, stream.run_id, FuzzService.metadata(stream.owner))
            await asyncio.wait([s.task for s in streams], timeout=0.2)
