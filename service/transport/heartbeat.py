"""The write side of a gRPC event stream, with heartbeats on silences.

`StreamWriter.write` sends one event of the run. While a stream says nothing
for `interval_s` (the run waits for Submit, a slow tool, a long model call),
`beat` sends a `heartbeat` event, so that idle-timeout proxies and load
balancers keep the connection and a client sees the stream is alive.

A heartbeat is not part of the run: it is never appended to the run's log, so
its `seq` is 0 and it carries only the envelope (type, timestamp, run and chat
ids). Attach and GetChat never replay one, and a client resuming with
`after_seq` keeps the `seq` of the last run event it saw. Writes of the relay
and of the heartbeat never overlap; the relay's writes take no lock unless a
heartbeat is being sent.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from typing import Any, TypeAlias

import grpc
from agw.v1 import events_pb2 as pb

from service.core.errors import RunHandedOver
from service.core.events import TERMINALS
from service.core.timers import Timer, shared_timer

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
    """Writes a run's events to one gRPC stream, and heartbeats when it falls silent.

    The heartbeat is a deadline on the loop's shared timer (service/core/timers.py), not
    a task: `start` arms it, and when it fires after `interval_s` of silence it sends one
    heartbeat (in a short task, in the call's context) and re-arms, so a stream that never
    falls silent costs no task and no wake-up at its end. On the
    per-event path a write takes no lock: `_writing` tells the timer a write is in
    flight (the stream is not silent), and only a write arriving while a heartbeat is
    being sent waits for it (`_beating`), so that two writes never overlap.
    """

    __slots__ = (
        "_beat",
        "_beat_sending",
        "_beating",
        "_context",
        "_last",
        "_loop",
        "_stopped",
        "_timer",
        "_writing",
        "chat_id",
        "context",
        "ended",
        "ending",
        "heartbeats",
        "interval_s",
        "last_seq",
        "run_id",
    )

    def __init__(
        self,
        context: Context,
        interval_s: float,
        *,
        run_id: str = "",
        chat_id: str = "",
        after_seq: int = 0,
    ) -> None:
        self.context = context
        self.interval_s = interval_s
        self.run_id = run_id
        self.chat_id = chat_id
        self.last_seq = after_seq  # of the last run event written
        self.ending = False  # the server stops: the stream ends after the write under way
        self.ended = False  # the run's terminal event was written: the stream ends as usual
        self.heartbeats = 0
        # Held while a heartbeat is being sent; made when the first one is.
        self._beating: asyncio.Lock | None = None
        self._beat_sending = False  # whether it is held (an attribute read, not a call)
        self._writing = False  # an event's write is in flight
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._timer: Timer | None = None
        self._beat: asyncio.Task[None] | None = None
        self._context: contextvars.Context | None = None  # the call's, for the heartbeats
        self._stopped = False

    async def write(self, event: pb.Event) -> None:
        """Send `event` (after a heartbeat being sent, if one is)."""
        if self._beat_sending and self._beating is not None:  # a heartbeat is being sent:
            # wait for it to end; no other one can start before this write does (nothing
            # suspends in between)
            async with self._beating:
                pass
        if self.ending:
            raise self.moved()
        self._writing = True
        try:
            await self.context.write(event)
        finally:
            self._writing = False
        self._last = self._loop.time()
        if event.seq:
            self.last_seq = event.seq
        if event.WhichOneof("payload") in TERMINALS:
            self.ended = True
        if not self.chat_id:
            self.run_id, self.chat_id = event.run_id, event.chat_id
        if self.ending and not self.ended:
            raise self.moved()

    @property
    def writing(self) -> bool:
        """Whether an event's write is under way."""
        return self._writing

    def moved(self) -> RunHandedOver:
        """How the stream ends when the server stops while the run goes on elsewhere."""
        return RunHandedOver(
            f"the service is shutting down; run {self.run_id} goes on: re-attach (Attach runId "
            f"{self.run_id}, afterSeq {self.last_seq}) on another instance",
            run_id=self.run_id,
            after_seq=str(self.last_seq),
        )

    def start(self) -> None:
        """Send a heartbeat after each `interval_s` of silence (0: never), until `stop`."""
        if self.interval_s > 0:
            # Heartbeats are written in the call's context, as its events are (what its
            # response serializer counts is found there), not in the shared timer's.
            self._context = contextvars.copy_context()
            self._arm(self.interval_s)

    async def stop(self) -> None:
        """No more heartbeats; waits for one being sent."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        beat = self._beat
        if beat is not None:
            beat.cancel()
            await asyncio.wait({beat})

    def _arm(self, delay: float) -> None:
        self._timer = shared_timer().call_later(delay, self._due)

    def _due(self) -> None:
        self._timer = None
        if self._stopped:
            return
        wait = self._last + self.interval_s - self._loop.time()
        if self._writing:  # a write is in flight: the stream is not silent
            self._last = self._loop.time()
            self._arm(self.interval_s)
        elif wait > 0:
            self._arm(wait)
        else:
            self._beat = self._loop.create_task(self._send_heartbeat(), context=self._context)

    async def _send_heartbeat(self) -> None:
        """One heartbeat, then the timer again — unless the stream failed (the client
        went away: nothing more to keep alive; the relay sees the failure too)."""
        if self._beating is None:
            self._beating = asyncio.Lock()
        try:
            async with self._beating:
                self._beat_sending = True
                try:
                    await self.context.write(heartbeat(self.run_id, self.chat_id))
                finally:
                    self._beat_sending = False
                self.heartbeats += 1
        except asyncio.CancelledError:
            raise
        except Exception:
            return
        finally:
            self._beat = None
        self._last = self._loop.time()
        if not self._stopped:
            self._arm(self.interval_s)
