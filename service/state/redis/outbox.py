"""The outbox: the events of the runs a replica executes, on their way to their streams.

The runs' logs hand every event over synchronously as readers get to see it (so the
run and its local followers never wait for Redis). The first event handed over in a
loop iteration schedules a flush with `call_soon` (no timer): what every run handed
over by then goes to Redis in one write — one `APPEND_MANY` call for all those runs,
each run's events in order. A write does not wait for the answers to earlier ones:
they follow one another on the outbox's own connection, which Redis executes in order,
and the answers are handled as they are read (`wire.py`). So a lone event goes out at
once, and under load one write carries what a whole iteration handed over.

Each run's part of the call checks the run's fence (a fenced owner writes and publishes
nothing), skips what is already there (a retried append), refuses to leave a hole
(`BEHIND`: an earlier write failed) and publishes the events it added on the run's
channel, for the mirrors of other replicas. The terminal event's append also marks the
run ended, frees the chat (marking it settling until the owner says `settled`) and
gives the stream and meta their expiry.

A run's events stay in its `pending` until an answer says they are appended. When a
write fails — an error, the connection lost, no answer within the socket time-out —
each run's events are sent again from the first one not known to be appended, after a
pause that grows while Redis keeps failing (0.05 s up to 2 s); what Redis already has
is skipped, so every seq is in the stream once, in order.

While Redis is unreachable the outbox keeps the events and appends them once it
answers again, so that followers on other replicas, which wait meanwhile, get them
then, each with the run's one terminal event. When Redis answers again without its
data, a run's events wait until the run is re-asserted (`epoch.py`), then its stream is
appended again whole, from the run's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from service.core.events import Event
from service.state.redis import scripts
from service.state.redis.link import Link
from service.state.redis.meta import is_terminal
from service.state.redis.owned import Owned
from service.state.redis.scripts import BEHIND, GONE
from service.state.redis.wire import Reply, ReplyError, Wire

log = logging.getLogger("agw.bus")

MAX_BATCH = 256  # events of one run per write
SETTLE_MARK_S = 30.0  # a settling mark outlives an owner that died before settling
WATCH_S = 1.0  # how often the writes not answered yet are looked at


@dataclass(slots=True)
class _Part:
    """One run's events in a write: `count` of them from its `pending`'s index `first`."""

    owned: Owned
    first: int
    count: int
    generation: int  # the run's, when sent: an answer for an older one is not counted
    ends: bool  # the last of them is the run's terminal event


@dataclass(slots=True)
class _Write:
    parts: list[_Part]
    at: float  # the loop's time when it was sent


class Outbox:
    """Appends the events of this replica's runs to their streams, in order per run.

    Per run an append answers 1 (appended), 0 (fenced out: `fence` is called), -2
    (`GONE`: Redis lost its data, `unknown` is called: the run's events wait until it is
    re-asserted, then its whole log is appended again, `resend`), -1 (`BEHIND`: an
    earlier write failed; sent again) or an error (sent again after a pause).
    """

    def __init__(
        self,
        link: Link,
        fence: Callable[[Owned], None],
        unknown: Callable[[Owned], None],
    ) -> None:
        self._link = link
        self._fence = fence
        self._unknown = unknown
        self._ready: dict[str, Owned] = {}  # the runs with events to send, by id
        self._flushing = False  # a flush is scheduled
        self._wire: Wire | None = None
        self._writes: deque[_Write] = deque()  # sent, not answered yet, in order
        self._idle = asyncio.Event()  # no write is waiting for its answer
        self._idle.set()
        self._paused = 0  # `paused` blocks under way
        self._failures = 0  # writes (or connections) failed in a row
        self._load_script = False  # Redis lost its scripts: load it before writing again
        self._task: asyncio.Task[None] | None = None  # connecting, or pausing after a failure
        self._watch: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """Its tasks (stopped at close)."""
        return [task for task in (self._task, self._watch) if task is not None]

    def start(self) -> None:
        self._watch = asyncio.create_task(self._watch_writes(), name="outbox-watch")
        self._kick()  # connected now, not with the first event

    async def close(self) -> None:
        self._closed = True
        for task in self.tasks:
            task.cancel()
        if self._wire is not None:
            self._wire.close()

    def push(self, owned: Owned, event: Event) -> None:
        """Hand an event of `owned` over as readers get to see it (its log calls this, in
        order); it is sent with the others of this loop iteration."""
        if not owned.live:
            return
        owned.pending.append(event)
        owned.drained.clear()
        self._ready[owned.run.run_id] = owned
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    def resend(self, owned: Owned) -> None:
        """The run was re-asserted after Redis lost its data: append its whole log again
        (what its stream has is skipped), and what it holds back from now on."""
        owned.restore = False
        owned.resend = True
        owned.drained.clear()
        self._ready[owned.run.run_id] = owned
        self._schedule()

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """No write is under way (sent and not answered), nor begins, inside the block."""
        self._paused += 1
        try:
            await self._idle.wait()
            yield
        finally:
            self._paused -= 1
            self._schedule()

    def _schedule(self) -> None:
        if not self._flushing and not self._closed:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    # -- writing -----------------------------------------------------------------------

    def _flush(self) -> None:
        """Send what the ready runs have not sent yet, in one write."""
        self._flushing = False
        if not self._ready or self._paused or self._closed:
            return
        wire = self._wire
        if self._task is not None or wire is None or not wire.connected or self._link.suspended:
            self._kick()  # the task flushes once it is done
            return
        if not wire.writable:
            return  # flushed again when the transport drained (`on_writable`)
        parts: list[_Part] = []
        keys: list[str] = []
        args: list[Any] = []
        still: dict[str, Owned] = {}  # more than one write's worth
        link = self._link
        settle_ms = round(SETTLE_MARK_S * 1000)
        for run_id, owned in self._ready.items():
            if owned.restore or not owned.live:  # held until re-asserted (`resend`), or over
                continue
            if owned.resend:  # the stream is to be whole again: from the run's first event
                owned.resend = False
                log_ = owned.run.log
                owned.pending = list(log_[: log_.visible])  # the rest comes as it is durable
                owned.sent = 0
                owned.generation += 1
            first = owned.sent
            batch = owned.pending[first : first + MAX_BATCH]
            if not batch:
                continue
            if first + len(batch) < len(owned.pending):
                still[run_id] = owned
            ends = is_terminal(batch[-1])
            end_ms = link.end_ms if ends else 0
            run_args = link.append_argv(owned.fence, run_id, "", end_ms, settle_ms, batch)
            keys += link.keys.appending(run_id, owned.run.chat_id)
            args.append(len(run_args))
            args += run_args
            parts.append(_Part(owned, first, len(batch), owned.generation, ends))
            owned.sent = first + len(batch)
        self._ready = still
        if still:
            self._schedule()
        if not parts:
            return
        try:
            wire.send(("EVALSHA", link.append_many.sha, len(keys), *keys, len(parts), *args))
        except (RedisError, OSError) as error:  # the connection is gone: sent again later
            for part in parts:
                self._again(part.owned)
            self._failed(error)
            return
        self._writes.append(_Write(parts, asyncio.get_running_loop().time()))
        self._idle.clear()

    def _answered(self, reply: Reply) -> None:
        """The answer to the oldest write under way."""
        write = self._writes.popleft()
        if not self._writes:
            self._idle.set()
        if isinstance(reply, ReplyError):
            if str(reply).startswith("NOSCRIPT"):
                self._load_script = True  # the server lost its scripts
            answers: list[Any] = [reply] * len(write.parts)
        else:
            answers = reply
        failed: Exception | None = None
        for part, answer in zip(write.parts, answers, strict=True):
            owned = part.owned
            if part.generation != owned.generation:
                continue  # sent again since (an earlier write failed): that one counts
            if isinstance(answer, Exception):
                failed = answer
                self._again(owned)
                continue
            if answer == BEHIND:  # an earlier part of the run failed: from there again
                if part.first == 0:  # the stream lacks what it was told: all of it again
                    owned.resend = True
                    failed = RedisError("a run's stream ends before its appended events")
                self._again(owned)
                continue
            owned.sent -= part.count
            if answer == GONE:  # Redis lost the run: its events wait for its re-assertion
                owned.generation += 1
                owned.sent = 0
                self._unknown(owned)
                continue
            if not answer:
                owned.generation += 1
                owned.sent = 0
                self._fence(owned)
                continue
            del owned.pending[: part.count]
            if part.ends:
                owned.published_end = True
            if not owned.pending or not owned.live:
                owned.pending.clear()
                owned.sent = 0
                owned.drained.set()
        if failed is not None:
            self._failed(failed)
        elif self._failures and not self._writes:
            self._failures = 0
            log.info("the outbox of replica %s: Redis answers again", self._link.replica_id)
        if self._ready:
            self._schedule()

    def _again(self, owned: Owned) -> None:
        """What of `owned` is under way is to be sent again, from its first pending event."""
        owned.generation += 1
        owned.sent = 0
        if owned.live:
            self._ready.setdefault(owned.run.run_id, owned)

    def _failed(self, error: BaseException) -> None:
        if not self._failures:
            log.warning("cannot publish events (%s); retrying", error)
        self._failures += 1
        self._kick()

    def _lost(self, wire: Wire, _: asyncio.Future[None]) -> None:
        """The connection is gone: the writes under way are sent again (on a new one)."""
        if wire is not self._wire:
            return
        self._wire = None
        if self._closed:
            return
        writes, self._writes = self._writes, deque()
        self._idle.set()
        for write in writes:
            for part in write.parts:
                if part.generation == part.owned.generation:
                    self._again(part.owned)
        if writes:
            error = wire.lost.exception() if not wire.lost.cancelled() else None
            self._failed(error or RedisError("the connection to Redis was closed"))
        elif self._ready:
            self._kick()

    # -- connecting, pausing -----------------------------------------------------------

    def _kick(self) -> None:
        """Make ready to write (a pause after failures, a connection, the script), then
        flush; one task at a time."""
        if self._task is None and not self._closed:
            self._task = asyncio.create_task(self._prepare(), name="outbox")
            self._task.add_done_callback(self._prepared)

    def _prepared(self, task: asyncio.Task[None]) -> None:
        if self._task is task:
            self._task = None
        if not task.cancelled():
            task.exception()  # retrieved (none is expected: `_prepare` logs its own)
            self._schedule()

    async def _prepare(self) -> None:
        while True:
            try:
                if self._failures:
                    await asyncio.sleep(min(0.05 * 2 ** (self._failures - 1), 2.0))
                await self._link.writable()
                if self._load_script:
                    await self._link.redis.script_load(scripts.APPEND_MANY)
                    self._load_script = False
                if self._wire is None or not self._wire.connected:
                    wire = Wire(self._answered)
                    wire.on_writable = self._schedule
                    await wire.connect(self._link.own_connection("outbox"))
                    self._wire = wire
                    wire.lost.add_done_callback(functools.partial(self._lost, wire))
                return
            except (RedisError, OSError) as error:
                if not self._failures:
                    log.warning("cannot publish events (%s); retrying", error)
                self._failures += 1

    async def _watch_writes(self) -> None:
        """Cut the connection when the oldest write waits for its answer longer than the
        socket time-out (a frozen server): the writes are sent again on a new one."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(WATCH_S)
            wire = self._wire
            if wire is not None and self._writes:
                waited = loop.time() - self._writes[0].at
                if waited > self._link.socket_timeout_s:
                    wire.abort(RedisError(f"no answer from Redis for {waited:.0f} s"))
