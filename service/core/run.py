"""A run: its event log, the envelope of every event, and its lifecycle.

The log *is* the channel. The run's task appends events; each subscriber reads
the log from its own position and waits when it has caught up. A subscriber
therefore never stalls the run, never holds a queue of its own, and re-joining
from any `seq` is a read of the log from that index — no gap, no duplicate.

`Run.emit` guarantees the stream's invariants: seq counts from 1 without holes,
every `*.start` still open when the run ends gets its `*.end`, and exactly one
terminal event is appended, after which the log is closed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from service.core import events
from service.core.events import BLOCK_ENDS, BLOCKS, EVENT_TYPES, TERMINALS, Event


class Run:
    """The live state of one run of an agent on a chat."""

    def __init__(self, run_id: str, chat_id: str, agent_key: str) -> None:
        self.run_id = run_id
        self.chat_id = chat_id
        self.agent_key = agent_key
        self.log: list[Event] = []
        self.task_id = ""  # the plan task whose events are being emitted, if any
        self.task: asyncio.Task[None] | None = None
        self.cancel_reason = ""
        self.started_at = time.monotonic()
        self.ended_at: float | None = None
        self._open: dict[str, Event] = {}  # block id -> its start event, in opening order
        self._waiters: list[asyncio.Future[None]] = []
        self._finished = asyncio.Event()

    @property
    def done(self) -> bool:
        """Whether the terminal event has been emitted."""
        return self._finished.is_set()

    @property
    def terminal(self) -> Event | None:
        return self.log[-1] if self.done else None

    def emit(self, event: Event) -> Event:
        """Stamp the envelope on `event`, append it to the log and wake the subscribers."""
        if self.done:
            raise RuntimeError(f"run {self.run_id} already ended; cannot emit {event}")
        field = event.WhichOneof("payload")
        if field is None:
            raise ValueError("event without payload")
        event.seq = len(self.log) + 1
        event.type = EVENT_TYPES[field]
        event.timestamp = time.time_ns() // 1_000_000
        event.chat_id = self.chat_id
        event.run_id = self.run_id
        if self.task_id and not event.task_id:
            event.task_id = self.task_id
        if field in BLOCKS:
            self._open[getattr(getattr(event, field), BLOCKS[field][1])] = event
        elif field in BLOCK_ENDS:
            self._open.pop(getattr(getattr(event, field), BLOCK_ENDS[field]), None)
        self.log.append(event)
        if field in TERMINALS:
            self.ended_at = time.monotonic()
            self._finished.set()
        self._wake()
        return event

    def finish(self, terminal: Event) -> Event:
        """Close every open block (innermost first), then emit the terminal event."""
        for start in reversed(list(self._open.values())):
            self.emit(events.end_of(start))
        return self.emit(terminal)

    def cancel(self, reason: str) -> bool:
        """Ask the run's task to stop; the run ends with `run.cancel` carrying `reason`."""
        if self.done or self.task is None or self.task.done():
            return False
        if not self.cancel_reason:
            self.cancel_reason = reason
        self.task.cancel(reason)
        return True

    async def wait(self) -> None:
        """Wait until the terminal event has been emitted."""
        await self._finished.wait()

    async def follow(self, after_seq: int = 0) -> AsyncIterator[Event]:
        """The events with seq > `after_seq`: the recorded ones, then the live ones, to the end."""
        index = max(after_seq, 0)
        log = self.log
        while True:
            while index < len(log):
                index += 1
                yield log[index - 1]
            if self.done:
                return
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
