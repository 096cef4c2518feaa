"""An AG-UI thread's waiting run, found and projected again from nothing kept in memory.

An AG-UI run that answers tool calls or interrupts may reach any adapter
process (several workers, replicas behind a load balancer), so the adapter
keeps nothing between AG-UI runs. The thread's agw run in progress comes from
`GetChat(threadId).live_run`; the projection the earlier AG-UI runs of the
thread made of it is rebuilt by projecting the run's events again, silently,
from its start (`Attach` after 0) up to where the run last blocked:

- up to `last_seq` (the run's last event when the answer came in, read before
  anything is submitted), each block followed by more events was answered in
  an earlier AG-UI run (the run went on): it is resumed with those answers, as
  that AG-UI run did;
- the block reached at or after `last_seq` is the one the client answers now.
  Past `last_seq` (a replica's view of the stream may trail the events the
  client saw) the replay waits for it at most `SETTLE_S`.

The same `Attach` call then streams the continuation: the events after the block.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from service.gateway.agui_events import Projection

#: How long the replay waits, past the run's last seq, for the block the client answers.
SETTLE_S = 2.0


async def replay(call: Any, projection: Projection, last_seq: int) -> bool:
    """Project `call`'s events into `projection`, silently, up to the block the client
    answers: True when the run waits there, False when it ended or never blocked."""
    while True:
        if projection.finished:
            if not (projection.pending or projection.interrupts):
                return False  # the run ended
            if projection.last_seq >= last_seq:
                return True
        try:
            if projection.last_seq >= last_seq:
                async with asyncio.timeout(SETTLE_S):
                    message = await call.read()
            else:
                message = await call.read()
        except TimeoutError:
            return False
        if message is grpc.aio.EOF:
            return False
        if not message.seq:  # a heartbeat
            continue
        if projection.finished:  # the run went on: an earlier AG-UI run answered the block
            answered = [*projection.pending, *(ask["id"] for ask in projection.interrupts)]
            projection.resume(projection.run_id, answered)
        projection.project(message)
