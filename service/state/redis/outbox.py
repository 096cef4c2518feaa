"""The outbox: the events of the runs a replica executes, on their way to their streams.

The runs' logs hand every appended event over synchronously (so the run and its
local followers never wait for Redis); one task appends what waits, for every run
at once, in one pipelined round trip on a connection of its own, each run's events
in order. Under load a replica thus makes one append round trip at a time, not one
per run or per event.

Each run's batch goes through the `APPEND` script, which first checks the run's
fence (a fenced owner writes and publishes nothing), skips what is already there
(a retried append) and publishes the events it added on the run's channel, for
the mirrors of other replicas. The terminal event's append also marks the run
ended, frees the chat (marking it settling until the owner says `settled`) and
gives the stream and meta their expiry.

While Redis is unreachable the outbox keeps the events and appends them once it
answers again, so that followers on other replicas, which wait meanwhile, get
them then, each with the run's one terminal event. When Redis answers again
without its data, a run's events wait until the run is re-asserted (`epoch.py`),
then its stream is appended again whole, from the run's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from redis.exceptions import NoScriptError, RedisError, ResponseError

from service.core.events import Event
from service.state.redis import scripts
from service.state.redis.link import Link
from service.state.redis.meta import is_terminal
from service.state.redis.owned import Owned
from service.state.redis.scripts import GONE

log = logging.getLogger("agw.bus")

MAX_BATCH = 256  # events of one run per append
SETTLE_MARK_S = 30.0  # a settling mark outlives an owner that died before settling


class Outbox:
    """Appends the events of this replica's runs to their streams, in order per run.

    Per run an append answers 1 (appended), 0 (fenced out: `fence` is called), -2
    (`GONE`: Redis lost its data, `unknown` is called: the run's events wait until it
    is re-asserted, then its whole log is appended again, `resend`) or an error
    (retried).
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
        self._connection = link.own_connection()  # one append at a time
        self._ready: dict[str, Owned] = {}  # the runs with events waiting, by id
        self._wake = asyncio.Event()
        self._appending = asyncio.Lock()  # held by each append round trip (see `paused`)
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name="outbox")

    async def close(self) -> None:
        await self._connection.disconnect(nowait=True)

    def push(self, owned: Owned, event: Event) -> None:
        """Hand an appended event of `owned` over (its log calls this, in order)."""
        if not owned.live:
            return
        owned.pending.append(event)
        owned.drained.clear()
        self._ready[owned.run.run_id] = owned
        self._wake.set()

    def resend(self, owned: Owned) -> None:
        """The run was re-asserted after Redis lost its data: append its whole log again
        (what its stream has is skipped), and what it holds back from now on."""
        owned.restore = False
        owned.resend = True
        owned.drained.clear()
        self._ready[owned.run.run_id] = owned
        self._wake.set()

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """No append is under way, nor begins, inside the block."""
        async with self._appending:
            yield

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._ready:
                await self._link.writable()
                async with self._appending:
                    failed = await self._append_ready()
                if failed:
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                else:
                    backoff = 0.05

    async def _append_ready(self) -> bool:
        """Append what waits, for every run at once; True when Redis could not be reached."""
        batch = []
        for owned in self._ready.values():
            if owned.restore:  # held until the run is re-asserted (`resend`)
                continue
            if owned.resend:  # the stream is to be whole again: from the run's first event
                owned.resend = False
                log_ = owned.run.log
                owned.pending = list(log_[: log_.visible])  # the rest comes as it is durable
            batch.append((owned, owned.pending[:MAX_BATCH]))
        self._ready.clear()
        if not batch:
            return False
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
            if result == GONE:  # Redis lost the run: its events wait for its re-assertion
                self._unknown(owned)
                continue
            del owned.pending[: len(events)]
            if not result:
                self._fence(owned)
            elif events and is_terminal(events[-1]):
                owned.published_end = True
            if owned.pending and owned.live:
                self._ready.setdefault(owned.run.run_id, owned)
            else:
                owned.pending.clear()
                owned.drained.set()
        return failed

    def _append_args(self, owned: Owned, batch: Sequence[Event]) -> list[Any]:
        end_ms = self._link.end_ms if batch and is_terminal(batch[-1]) else 0
        settle_ms = round(SETTLE_MARK_S * 1000)
        return self._link.append_argv(owned.fence, owned.run.run_id, "", end_ms, settle_ms, batch)

    async def _append(self, batches: Sequence[tuple[Owned, list[Event]]]) -> list[object]:
        """Append each run's batch under its fence, all in one round trip, on the outbox's
        own connection: the commands packed at once, the answers read."""
        commands = []
        for owned, batch in batches:
            keys = self._link.keys.appending(owned.run.run_id, owned.run.chat_id)
            args = self._append_args(owned, batch)
            commands.append(("EVALSHA", self._link.append.sha, len(keys), *keys, *args))
        conn = self._connection
        results: list[object] = []
        try:
            if not conn.is_connected:
                await conn.connect()  # type: ignore[no-untyped-call]
            await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            for _command in commands:
                try:
                    results.append(int(await conn.read_response()))
                except ResponseError as error:
                    results.append(error)
        except BaseException:
            await conn.disconnect(nowait=True)  # answers may be left unread on it
            raise
        if any(isinstance(result, NoScriptError) for result in results):
            await self._link.redis.script_load(scripts.APPEND)  # the server lost its scripts
        return results
