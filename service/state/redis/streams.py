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
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError, RedisError

from service.core.events import TERMINALS, Event
from service.core.runstate import RunState
from service.state.redis.scripts import GONE

log = logging.getLogger("agw.bus")

MAX_BATCH = 256  # events of one run per append
RECONNECT_S = 0.05  # the pause before the pub/sub connection, once cut, is made again


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


class Subscriber:
    """The replica's one pub/sub connection: the channels of the runs it follows.

    A channel is subscribed before its stream is read (`subscribe` returns once Redis
    has it), so an event is in what was read or pushed afterwards, or both. A push
    lost — the connection cut, or dropped by Redis for a full output buffer — shows
    as a gap (the next push's seq) or as a reconnection: `resubscribed` is called
    once every channel is subscribed again on a new connection, for the mirrors to
    read their streams from where they are. A connection silent for `idle_s` is
    pinged; one that does not answer in `idle_s` more is taken as cut.
    """

    def __init__(
        self,
        connection: Callable[[], AbstractConnection],
        pushed: Callable[[bytes, bytes], None],
        resubscribed: Callable[[], None],
        idle_s: float,
    ) -> None:
        self._connection = connection
        self._pushed = pushed
        self._resubscribed = resubscribed
        self.idle_s = idle_s
        self.channels: set[bytes] = set()  # those wanted
        self._dropped: set[bytes] = set()  # no longer wanted, to unsubscribe
        self._conn: AbstractConnection | None = None
        self._connected = asyncio.Event()
        self._failed = False  # the last connection failed (Redis unreachable)
        self._pongs: dict[bytes, asyncio.Future[None]] = {}
        self._tokens = itertools.count()
        self._flushing: asyncio.Task[None] | None = None
        self.connections = 0  # how many connections were made so far (the last one's number)

    async def subscribe(self, channel: bytes) -> None:
        """Subscribe to `channel`; return once Redis has it. A `ConnectionError` when the
        connection is down (Redis unreachable) or is cut meanwhile."""
        self.channels.add(channel)
        self._dropped.discard(channel)
        if self._conn is None and self._failed:
            raise ConnectionError("the run bus's pub/sub connection is down")
        await self._connected.wait()
        conn = self._conn
        if conn is None:
            raise ConnectionError("the run bus's pub/sub connection is down")
        token = b"subscribed-%d" % next(self._tokens)
        answered = asyncio.get_running_loop().create_future()
        self._pongs[token] = answered
        try:
            await conn.send_packed_command(
                conn.pack_commands([("SUBSCRIBE", channel), ("PING", token)]), check_health=False
            )
            await answered
        finally:
            self._pongs.pop(token, None)

    def unsubscribe(self, channel: bytes) -> None:
        """No longer want `channel` (unsubscribed soon: those dropped meanwhile go together)."""
        if channel in self.channels:
            self.channels.discard(channel)
            self._dropped.add(channel)
            if self._flushing is None:
                self._flushing = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        """Unsubscribe from the channels no longer wanted (a connection made meanwhile
        subscribed to the wanted ones only)."""
        try:
            await asyncio.sleep(0)
            dropped = [c for c in self._dropped if c not in self.channels]
            self._dropped.clear()
            conn = self._conn
            if dropped and conn is not None and conn.is_connected:
                await conn.send_packed_command(
                    conn.pack_command("UNSUBSCRIBE", *dropped), check_health=False
                )
        except (RedisError, OSError) as error:  # the reader sees the connection cut
            log.warning("cannot unsubscribe (%s)", error)
        finally:
            self._flushing = None

    async def close(self) -> None:
        if self._flushing is not None:
            self._flushing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flushing

    async def run(self) -> None:
        """One connection's life: connect, subscribe to every channel wanted, and hand
        over what is pushed until the connection is cut (returns: connect again); a
        failure to connect is raised."""
        conn = self._connection()
        try:
            try:
                await conn.connect()  # type: ignore[no-untyped-call]
                self._dropped.clear()
                commands: list[tuple[Any, ...]] = []
                if self.channels:
                    commands.append(("SUBSCRIBE", *self.channels))
                commands.append(("PING", b"resubscribed"))
                await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            except BaseException:
                self._failed = True
                raise
            self._conn = conn
            self.connections += 1
            self._failed = False
            self._connected.set()
            await self._read(conn)
        except (RedisError, OSError) as error:
            if self._conn is not conn:  # could not connect: Redis unreachable (retried later)
                raise
            self._drop(conn)
            log.warning("the pub/sub connection was cut (%s); reconnecting", error)
            await asyncio.sleep(RECONNECT_S)  # what it missed is read from the streams
        finally:
            self._drop(conn)
            await conn.disconnect(nowait=True)

    def _drop(self, conn: AbstractConnection) -> None:
        """Stop using `conn`: the subscriptions waiting on it fail."""
        if self._conn is conn:
            self._conn = None
            self._connected.clear()
        for answered in self._pongs.values():
            if not answered.done():
                answered.set_exception(ConnectionError("the pub/sub connection was cut"))

    async def _read(self, conn: AbstractConnection) -> None:
        pinged = False
        while True:
            reply = await conn.read_response(timeout=self.idle_s, push_request=True)
            if reply is None:  # silent for idle_s
                if pinged:
                    raise ConnectionError(f"no answer from Redis for {2 * self.idle_s:g} s")
                await conn.send_packed_command(conn.pack_command("PING"), check_health=False)
                pinged = True
                continue
            pinged = False
            kind = reply[0]
            if kind == b"message":
                self._pushed(reply[1], reply[2])
            elif kind == b"pong":
                if reply[1] == b"resubscribed":
                    self._resubscribed()
                elif (answered := self._pongs.get(reply[1])) is not None and not answered.done():
                    answered.set_result(None)
