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
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from service.core import events
from service.core.events import BLOCK_ENDS, BLOCKS, EVENT_TYPES, TERMINALS, Event
from service.core.middleware import hooks


class Run:
    """The live state of one run of an agent on a chat."""

    def __init__(
        self, run_id: str, chat_id: str, agent_key: str, middlewares: Sequence[object] = ()
    ) -> None:
        self.run_id = run_id
        self.chat_id = chat_id
        self.agent_key = agent_key
        self.log: list[Event] = []
        self.task_id = ""  # the plan task whose events are being emitted, if any
        self.task: asyncio.Task[None] | None = None
        self.cancel_reason = ""
        self.started_at = time.monotonic()
        self.ended_at: float | None = None
        # Observers of every emitted event, and of every finished model turn (request, result);
        # the chat recorder uses both.
        self.observers: list[Callable[[Event], None]] = []
        self.on_turn: Callable[[Any, Any], None] | None = None
        self.subscribers = 0  # clients following the run right now
        self.on_unwatched: Callable[[Run], None] | None = None  # last subscriber left
        self.debug_level = 0  # agw.v1.DebugLevel: which debug events this run emits
        # Accounting of the run's model calls (service/core/observe.py).
        self.model_calls = 0
        self.usage: Any = None  # model.Usage summed over the calls that reported one
        self.cost = 0.0
        self.currency = "USD"
        self.pricing: Callable[[str, Any], float | None] | None = None
        self.middlewares = middlewares
        self._on_event = hooks(middlewares, "on_event")
        self._dropped: set[str] = set()  # ids of blocks whose start a middleware dropped
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
        field: str | None = event.WhichOneof("payload")
        if field is None:
            raise ValueError("event without payload")
        event.type = EVENT_TYPES[field]
        event.timestamp = time.time_ns() // 1_000_000
        event.chat_id = self.chat_id
        event.run_id = self.run_id
        if self.task_id and not event.task_id:
            event.task_id = self.task_id
        if self._on_event:
            kept = self._apply_middlewares(event, field)
            if kept is None:
                return event
            event, field = kept
        event.seq = len(self.log) + 1
        if field in BLOCKS:
            self._open[getattr(getattr(event, field), BLOCKS[field][1])] = event
        elif field in BLOCK_ENDS:
            self._open.pop(getattr(getattr(event, field), BLOCK_ENDS[field]), None)
        self.log.append(event)
        for observer in self.observers:
            observer(event)
        if field in TERMINALS:
            self.ended_at = time.monotonic()
            self._finished.set()
        self._wake()
        return event

    def _apply_middlewares(self, event: Event, field: str) -> tuple[Event, str] | None:
        """Pass `event` through the middlewares; None when it is dropped."""
        original = event
        for on_event in self._on_event:
            changed = on_event(self, event)
            if changed is None:
                if field in TERMINALS:  # a run always ends with its terminal event
                    event = original
                    break
                if field in BLOCKS:
                    self._dropped.add(getattr(getattr(event, field), BLOCKS[field][1]))
                return None
            event = changed
        new_field: str | None = event.WhichOneof("payload")
        if new_field is None:
            raise ValueError("a middleware returned an event without payload")
        if field in TERMINALS and new_field not in TERMINALS:
            event, new_field = original, field
        if new_field != field:
            event.type = EVENT_TYPES[new_field]
        if new_field in BLOCK_ENDS and self._dropped:
            block_id = getattr(getattr(event, new_field), BLOCK_ENDS[new_field])
            if block_id in self._dropped:
                self._dropped.discard(block_id)
                return None
        return event, new_field

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

    async def follow(self, after_seq: int = 0) -> AsyncGenerator[Event, None]:
        """The events with seq > `after_seq`: the recorded ones, then the live ones, to the end."""
        index = max(after_seq, 0)
        log = self.log
        self.subscribers += 1
        try:
            while True:
                while index < len(log):
                    index += 1
                    yield log[index - 1]
                if self.done:
                    return
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                await waiter
        finally:
            self.subscribers -= 1
            if self.subscribers == 0 and not self.done and self.on_unwatched is not None:
                self.on_unwatched(self)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
