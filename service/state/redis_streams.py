"""A replica's two sides of the runs' Redis streams: its outbox and its mirrors.

- `Outbox`: the events of the runs this replica executes, on their way to their
  streams. The runs' logs hand every appended event over synchronously (so the
  run and its local followers never wait for Redis); one task appends what
  waits, for every run at once, in one pipelined round trip, each run's events
  in order. Under load a replica thus makes one append round trip at a time,
  not one per run or per event.
- `Mirror`: a run of another replica as this one follows it — its events read
  from the stream so far. Every follower of the run on this replica reads the
  one mirror, as followers on the owner read the run's log (from any seq, no
  gap, no duplicate); the bus's one reader fills every mirror.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from service.core.events import TERMINALS, Event
from service.core.runstate import RunState
from service.state.redis_scripts import GONE

log = logging.getLogger("agw.bus")

MAX_BATCH = 256  # events of one run per append


def is_terminal(event: Event) -> bool:
    return event.WhichOneof("payload") in TERMINALS


@dataclass(slots=True, eq=False)
class Owned:
    """A run this replica executes: its fence token and its events not yet appended."""

    run: RunState
    fence: int
    pending: list[Event] = field(default_factory=list)
    drained: asyncio.Event = field(default_factory=asyncio.Event)  # nothing pending
    published_end: bool = False  # the run's end is in Redis
    fenced: bool = False  # another replica took the run over

    def __post_init__(self) -> None:
        self.drained.set()

    @property
    def live(self) -> bool:
        """Whether its lease is still to be renewed."""
        return not (self.fenced or self.published_end)

    async def wait_drained(self, timeout_s: float) -> bool:
        """Wait until what was handed over so far is appended; False on time-out."""
        try:
            async with asyncio.timeout(timeout_s):
                await self.drained.wait()
        except TimeoutError:
            return False
        return True


#: Appends each run's events; per run: 1 appended, 0 fenced out, -2 (`GONE`) unknown to
#: Redis (it lost its data), an exception to retry.
Append = Callable[[Sequence[tuple[Owned, list[Event]]]], Awaitable[list[object]]]


class Outbox:
    """Appends the events of this replica's runs to their streams, in order per run."""

    def __init__(
        self,
        append: Append,
        fence: Callable[[Owned], None],
        unknown: Callable[[Owned], None],
        writable: Callable[[], Awaitable[None]],
    ) -> None:
        self._append = append
        self._fence = fence
        self._unknown = unknown
        self._writable = writable
        self._ready: dict[str, Owned] = {}  # the runs with events waiting, by id
        self._wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name="outbox")

    def push(self, owned: Owned, event: Event) -> None:
        """Hand an appended event of `owned` over (its log calls this, in order)."""
        if not owned.live:
            return
        owned.pending.append(event)
        owned.drained.clear()
        self._ready[owned.run.run_id] = owned
        self._wake.set()

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._ready:
                await self._writable()
                batch = [(owned, owned.pending[:MAX_BATCH]) for owned in self._ready.values()]
                self._ready.clear()
                try:
                    results = await self._append(batch)
                except (RedisError, OSError) as error:
                    results = [error] * len(batch)
                except Exception as error:
                    log.exception("cannot publish events")
                    results = [error] * len(batch)
                failed = False
                for (owned, events), result in zip(batch, results, strict=True):
                    if isinstance(result, Exception):
                        if not failed:
                            log.warning("cannot publish events (%s); retrying", result)
                        failed = True
                        if owned.live:
                            self._ready.setdefault(owned.run.run_id, owned)
                        continue
                    del owned.pending[: len(events)]
                    if result == GONE:
                        self._unknown(owned)
                    elif not result:
                        self._fence(owned)
                    elif events and is_terminal(events[-1]):
                        owned.published_end = True
                    if owned.pending and owned.live:
                        self._ready.setdefault(owned.run.run_id, owned)
                    else:
                        owned.pending.clear()
                        owned.drained.set()
                if failed:
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                else:
                    backoff = 0.05


class Mirror:
    """A run of another replica: its events so far, read from its stream, and its readers."""

    def __init__(self, run_id: str, events: Sequence[Event], done: bool) -> None:
        self.run_id = run_id
        self.events: list[Event] = []
        self.offset = events[0].seq - 1 if events else 0  # the stream may have been trimmed
        self.done = False
        self.followers = 0
        self.progress_at = time.monotonic()  # when events last came (or the owner was checked)
        self.idle_since = time.monotonic()  # when it last had no follower
        self.on_idle: Callable[[Mirror], None] | None = None  # its last follower left
        self._waiters: list[asyncio.Future[None]] = []
        self.extend(events)
        if done:
            self.finish()

    @property
    def last(self) -> int:
        """The seq of its last event (what the stream is read after)."""
        return self.events[-1].seq if self.events else self.offset

    def extend(self, events: Sequence[Event]) -> None:
        """Add the events read after `last` (older ones are skipped), waking the followers."""
        for event in events:
            if self.done or event.seq <= self.last:
                continue
            self.events.append(event)
            if is_terminal(event):
                self.done = True
        self.progress_at = time.monotonic()
        self._wake()

    def finish(self) -> None:
        """Nothing more will come (the run ended, or its stream is gone)."""
        self.done = True
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
