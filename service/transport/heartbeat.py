"""The write side of a gRPC event stream, with heartbeats on silences.

`StreamWriter.write` sends one event of the run. While a stream says nothing
for `interval_s` (the run waits for Submit, a slow tool, a long model call),
`beat` sends a `heartbeat` event, so that idle-timeout proxies and load
balancers keep the connection and a client sees the stream is alive.

A heartbeat is not part of the run: it is never appended to the run's log, so
its `seq` is 0 and it carries only the envelope (type, timestamp, run and chat
ids). Attach and GetChat never replay one, and a client resuming with
`after_seq` keeps the `seq` of the last run event it saw. Writes of the relay
and of the heartbeat never overlap (a lock, uncontended but at a silence).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, TypeAlias

import grpc
from agw.v1 import events_pb2 as pb

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]


def heartbeat(run_id: str, chat_id: str) -> pb.Event:
    """A heartbeat event of the run's stream (seq 0)."""
    return pb.Event(
        type="heartbeat",
        timestamp=time.time_ns() // 1_000_000,
        run_id=run_id,
        chat_id=chat_id,
        heartbeat=pb.Heartbeat(),
    )


class StreamWriter:
    """Writes a run's events to one gRPC stream, and heartbeats when it falls silent."""

    def __init__(
        self, context: Context, interval_s: float, *, run_id: str = "", chat_id: str = ""
    ) -> None:
        self.context = context
        self.interval_s = interval_s
        self.run_id = run_id
        self.chat_id = chat_id
        self.heartbeats = 0
        self._lock = asyncio.Lock()
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()

    async def write(self, event: pb.Event) -> None:
        """Send `event` (after a heartbeat being sent, if one is)."""
        async with self._lock:
            await self.context.write(event)
        self._last = self._loop.time()
        if not self.chat_id:
            self.run_id, self.chat_id = event.run_id, event.chat_id

    async def beat(self) -> None:
        """Send a heartbeat after each `interval_s` of silence, until cancelled or the
        stream fails (the relay then sees the failure too)."""
        try:
            while True:
                wait = self._last + self.interval_s - self._loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue
                async with self._lock:
                    if self._loop.time() - self._last >= self.interval_s:
                        await self.context.write(heartbeat(self.run_id, self.chat_id))
                        self.heartbeats += 1
                self._last = self._loop.time()
        except asyncio.CancelledError:
            raise
        except Exception:  # the client went away: nothing more to keep alive
            return
