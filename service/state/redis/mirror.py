"""A mirror: a run of another replica as this one follows it.

Its events are those read from the run's stream so far and those pushed on the
run's channel since (duplicates dropped, pushes after a gap kept until the stream
fills it). Every follower of the run on this replica reads the one mirror, as
followers on the owner read the run's log (from any seq, no gap, no duplicate);
the bus's one pub/sub reader fills every mirror (`mirrors.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Sequence

from service.core.events import Event
from service.state.redis.meta import is_terminal


class Mirror:
    """A run of another replica: its events so far, read from its stream or pushed on its
    channel, and its readers."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.events: list[Event] = []
        self.offset = 0  # the seq before its first event (the stream may have been trimmed)
        self.loaded = False  # the stream was read once (pushes before that wait in `ahead`)
        self.ahead: list[Event] = []  # pushed after a gap: kept until the gap is filled
        self.catching_up = False  # the stream is being read after `last`
        self.done = False
        self.followers = 0
        self.progress_at = time.monotonic()  # when events last came (or the owner was checked)
        self.idle_since = time.monotonic()  # when it last had no follower
        self.on_idle: Callable[[Mirror], None] | None = None  # its last follower left
        self.on_done: Callable[[Mirror], None] | None = None  # it ended (called once)
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def last(self) -> int:
        """The seq of its last event (what the stream is read after)."""
        return self.events[-1].seq if self.events else self.offset

    def load(self, events: Sequence[Event], done: bool) -> bool:
        """Its stream as first read (`done`: the run ended); True when pushed events wait
        behind a gap (the stream is to be read again)."""
        if events and not self.events:
            self.offset = events[0].seq - 1
        self.loaded = True
        gap = self.extend(events)
        if done:
            self.finish()
        return gap and not self.done

    def extend(self, events: Sequence[Event]) -> bool:
        """Add the events read from the stream after `last` (older ones are skipped; the
        stream is the truth, so a seq it skipped was trimmed), then those pushed that now
        follow on; True when pushed events still wait behind a gap."""
        added = False
        for event in events:
            if self.done or event.seq <= self.last:
                continue
            self._add(event)
            added = True
        gap = self.offer(())
        if added:
            self.progress_at = time.monotonic()
            self._wake()
        return gap

    def offer(self, pushed: Sequence[Event]) -> bool:
        """Add pushed events: those that follow on `last` at once (duplicates are dropped),
        the others kept in `ahead`; True when some wait there behind a gap."""
        waiting = [*self.ahead, *pushed] if self.ahead else pushed
        kept: list[Event] = []
        added = False
        for event in waiting:
            if self.done or event.seq <= self.last:
                continue
            if event.seq == self.last + 1 and (self.loaded or self.events or event.seq == 1):
                self._add(event)
                added = True
            else:
                kept.append(event)
        self.ahead = [e for e in kept if e.seq > self.last] if not self.done else []
        if added:
            self.progress_at = time.monotonic()
            self._wake()
        return bool(self.ahead)

    def _add(self, event: Event) -> None:
        self.events.append(event)
        if is_terminal(event):
            self._end()

    def _end(self) -> None:
        if not self.done:
            self.done = True
            if self.on_done is not None:
                self.on_done(self)

    def finish(self) -> None:
        """Nothing more will come (the run ended, or its stream is gone)."""
        self._end()
        self.ahead = []
        self.progress_at = time.monotonic()
        self._wake()

    def follow(self, after_seq: int) -> AsyncGenerator[Event, None]:
        """The events with seq > `after_seq`: those read, then those to come, to the end."""
        self.followers += 1  # from now: a follower about to read keeps the mirror filled
        return self._follow(after_seq)

    async def _follow(self, after_seq: int) -> AsyncGenerator[Event, None]:
        index = max(after_seq - self.offset, 0)
        try:
            while True:
                while index < len(self.events):
                    index += 1
                    yield self.events[index - 1]
                if self.done:
                    return
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                await waiter
        finally:
            self.followers -= 1
            if self.followers == 0:
                self.idle_since = time.monotonic()
                if self.on_idle is not None:
                    self.on_idle(self)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
