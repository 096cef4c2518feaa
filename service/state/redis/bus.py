"""The Redis-backed `RunBus`: any replica follows, answers and cancels any run.

The replica that executes a run (its *owner*) keeps it in its process as the
in-process bus does, and publishes every event of it to Redis; every other replica
reads the run from there. The keys and scripts are in `scripts.py`: per run a
stream of its events (entry id `0-<seq>`), a meta hash (chat, owner principal,
owner replica, status, fence token) and a lease; per chat its active run (claimed
with SET NX) and a settling mark; per replica a liveness key and an inbox.

`RedisRunBus` composes the parts, each a module of its own, all on one `Link`
(`link.py`: the client, the key names, the settings, Redis unreachable reported
as `BusUnavailable`) and one table of the runs this replica executes (`owned.py`):

- `registry.py`: claims and the registry — registering a run as its chat's active
  run, finding runs, their ends and the chats' settling marks, the open waits.
- `outbox.py`: the owner's events appended to the runs' streams, fenced, batched.
- `mirrors.py` (`mirror.py`, `subscriber.py`): following the runs of other
  replicas, pushed on their channels, read from their streams after a gap.
- `leases.py`: leases and owner loss — renewals, fences, a lost owner's runs resumed
  or ended as `OWNER_LOST`; the runs a draining replica hands over, taken over at once.
- `epoch.py`: Redis restarted empty — told by its epoch; the owners re-assert their
  runs' claims, meta, leases and streams before anyone else may claim their chats.
- `mailbox.py`: Submit and Cancel delivered to the owner's inbox, and answered.

Runs in flight go on on their owner while Redis is unreachable, whose clients see
them end as usual; the outbox keeps their events and appends them once Redis
answers again, so followers on other replicas, which wait meanwhile, get them
then, each with the run's one terminal event.

A single Redis server (or primary) is assumed, not Redis Cluster.
"""

from __future__ import annotations

import asyncio
import functools
import io
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from redis.exceptions import RedisError

from service.core.commands import SubmitCommand, SubmitResult
from service.core.errors import BusUnavailable
from service.core.events import Event
from service.core.run.state import RunState
from service.core.run.waits import Waits
from service.core.values import LiveRun, RunRef
from service.state.redis import scripts
from service.state.redis.epoch import Epoch
from service.state.redis.leases import Leases
from service.state.redis.link import Link
from service.state.redis.mailbox import Mailbox
from service.state.redis.mirrors import Mirrors
from service.state.redis.outbox import Outbox
from service.state.redis.owned import Owned, OwnedRuns
from service.state.redis.registry import Registry

log = logging.getLogger("agw.bus")

CLOSE_WAIT_S = 5.0  # how long `close` waits for its tasks to stop


class RedisRunBus:
    """The live runs of every replica, through one Redis server."""

    def __init__(
        self,
        url: str,
        *,
        replica_id: str = "",
        waits: Waits | None = None,
        lease_ttl_s: float = 10.0,
        stream_ttl_s: float = 600.0,
        lost_ttl_s: float = 7 * 86400.0,
        stream_maxlen: int = 100_000,
        reply_timeout_s: float = 5.0,
        prefix: str = "agw:",
    ) -> None:
        """`lease_ttl_s`: how long a silent owner keeps its runs; `stream_ttl_s`: how long
        an ended run's stream is kept (`lost_ttl_s` for a run whose owner was lost: no
        run log has it); `reply_timeout_s`: how long a forwarded Submit or Cancel waits."""
        self.link = Link(
            url,
            replica_id=replica_id,
            lease_ttl_s=lease_ttl_s,
            stream_ttl_s=stream_ttl_s,
            lost_ttl_s=lost_ttl_s,
            stream_maxlen=stream_maxlen,
            reply_timeout_s=reply_timeout_s,
            prefix=prefix,
        )
        self.replica_id = self.link.replica_id
        self.redis = self.link.redis
        self.keys = self.link.keys
        self.waits = waits if waits is not None else Waits()
        self._runs = OwnedRuns()
        self.leases = Leases(self.link, self._runs, self._gone)
        self._outbox = Outbox(self.link, self.leases.fence, self._gone)
        self.epoch = Epoch(self.link, self._runs, self.waits, self._outbox, self.leases.fence)
        self._registry = Registry(
            self.link, self._runs, self.waits, self.leases, self._outbox, self.epoch
        )
        self._mirrors = Mirrors(self.link, self.leases, reconnected=self.epoch.check_soon)
        self._mailbox = Mailbox(self.link, self._runs, self.waits, self.leases)
        self._loops: list[asyncio.Task[None]] = []
        self._adopting: dict[str, int] = {}  # runs declared lost here, being resumed: fence

    # -- lifecycle ---------------------------------------------------------------------

    async def open(self) -> None:
        await self.redis.set(self.keys.alive(self.replica_id), "1", px=self.link.lease_ms)
        await self.redis.sadd(self.keys.replicas, self.replica_id)
        await self.epoch.check()  # made now (with its window) on a Redis that has none
        for script in (scripts.APPEND_MANY, scripts.RENEW):  # called with EVALSHA in pipelines
            await self.redis.script_load(script)
        self._outbox.start()
        loops = {
            "leases": self.leases.renew,
            "inbox": self._mailbox.serve,
            "janitor": self.leases.janitor,
            "handovers": self.leases.take_handed_over,
            "reader": self._mirrors.read_pushed,
            "mirrors": self._mirrors.watch,
            "waits": self._registry.write_waits,
        }
        self._loops = [
            asyncio.create_task(self._forever(name, step), name=f"{name}-{self.replica_id}")
            for name, step in loops.items()
        ]
        log.info("run bus on Redis as replica %s", self.replica_id)

    async def close(self) -> None:
        tasks: list[asyncio.Task[Any]] = [
            *self._loops,
            *self.leases.tasks,
            *self._mirrors.tasks,
            *self.epoch.tasks,
            *self._outbox.tasks,
        ]
        for task in tasks:
            task.cancel()
        if tasks:  # a task that does not stop is named, not waited for forever
            stopped, stuck = await asyncio.wait(tasks, timeout=CLOSE_WAIT_S)
            for task in stopped:
                if not task.cancelled():
                    task.exception()  # retrieved: whatever it ended with is over
            for task in stuck:
                stack = io.StringIO()
                task.print_stack(file=stack)
                where = stack.getvalue()
                log.warning("replica %s: a task did not stop at close: %s", self.replica_id, where)
        await self._mirrors.close()
        await self._outbox.close()
        self._loops = []
        try:
            await self.redis.delete(
                self.keys.alive(self.replica_id), self.keys.draining(self.replica_id)
            )
            await self.redis.srem(self.keys.replicas, self.replica_id)
        except (RedisError, OSError) as error:
            log.warning("replica %s: could not sign off (%s)", self.replica_id, error)
        await self.redis.aclose()

    async def _forever(self, what: str, step: Callable[[], Awaitable[None]]) -> None:
        """Run `step` again and again; a failure is logged once, and `step` retried after a
        pause that grows while Redis stays unreachable (0.2 s up to 2 s)."""
        failures = 0
        while True:
            try:
                await step()
            except (RedisError, OSError) as error:
                if not failures:
                    log.warning("%s of replica %s: %s", what, self.replica_id, error)
                failures += 1
                await asyncio.sleep(min(0.2 * 2 ** (failures - 1), 2.0))
                continue
            except Exception:
                log.exception("%s of replica %s failed", what, self.replica_id)
                await asyncio.sleep(0.2)
                continue
            if failures:
                log.info("%s of replica %s: Redis answers again", what, self.replica_id)
                failures = 0

    def _gone(self, owned: Owned) -> None:
        """Redis no longer knows a run of this replica (it lost its data): re-assert it."""
        self.epoch.lost(owned)

    def suspend(self) -> None:
        """Stop writing to Redis — lease renewals and event appends — as a frozen or cut-off
        process would, until `resume`; the runs go on in this process (failure drills)."""
        self.link.suspend()

    def resume(self) -> None:
        self.link.resume()

    # -- the port ----------------------------------------------------------------------

    def on_lost(self, resume: Callable[[str, str], Awaitable[RunState | None]]) -> None:
        self.leases.resume = functools.partial(self._resume_lost, resume)

    async def _resume_lost(
        self,
        resume: Callable[[str, str], Awaitable[RunState | None]],
        run_id: str,
        fence: int,
        reason: str,
    ) -> bool:
        self._adopting[run_id] = fence
        try:
            return await resume(run_id, reason) is not None
        finally:
            self._adopting.pop(run_id, None)

    async def drain(self) -> None:
        try:
            await self.leases.drain()
        except BusUnavailable as error:  # it drains all the same; others may not know it
            log.warning("replica %s drains; could not say so (%s)", self.replica_id, error)

    async def can_hand_over(self) -> bool:
        try:
            return await self.leases.others_up()
        except BusUnavailable:
            return False  # nobody could take a run over now: the runs keep their grace

    async def hand_over(self, run: RunState) -> None:
        owned = self._runs.get(run.run_id)
        if owned is None:
            return
        try:
            handed = await self.leases.hand_over(owned)
        except BusUnavailable as error:  # its lease expires: a replica takes it over then
            log.warning("run %s: could not hand it over (%s)", run.run_id, error)
            handed = False
        if handed:
            log.info("run %s handed over: another replica takes it over", run.run_id)
        await self.release(run.run_id)

    async def adopt(self, run: RunState) -> bool:
        fence = self._adopting.get(run.run_id)
        if fence is None:  # not declared lost here: it cannot be taken over
            return False
        return await self._registry.adopt(run, fence)

    async def register(self, run: RunState, *, new_chat: bool = False) -> RunRef | None:
        return await self._registry.register(run, new_chat=new_chat)

    async def ended(self, run: RunState) -> None:
        await self._registry.ended(run)

    async def settled(self, run: RunState) -> None:
        await self._registry.settled(run)

    async def release(self, run_id: str) -> None:
        self._runs.free(run_id)
        self._runs.forget(run_id)
        self.waits.forget(run_id)

    def local(self, run_id: str) -> RunState | None:
        return self._runs.local(run_id)

    def local_runs(self) -> Mapping[str, RunState]:
        return self._runs.local_runs()

    async def find(self, run_id: str) -> RunRef | None:
        return await self._registry.find(run_id)

    async def active_of(self, chat_id: str) -> RunRef | None:
        return await self._registry.active_of(chat_id)

    async def live_of(self, chat_id: str) -> LiveRun | None:
        return await self._registry.live_of(chat_id)

    async def wait_ended(self, run_id: str) -> None:
        await self._registry.wait_ended(run_id)

    async def wait_settled(self, chat_id: str) -> None:
        await self._registry.wait_settled(chat_id)

    async def follow(self, run_id: str, after_seq: int) -> AsyncGenerator[Event, None] | None:
        run = self._runs.here(run_id)
        if run is not None:
            return run.follow(after_seq)
        return await self._mirrors.follow(run_id, after_seq)

    async def cancel(self, run_id: str, reason: str) -> bool | None:
        return await self._mailbox.cancel(run_id, reason)

    async def forget_chat(self, chat_id: str, run_ids: Sequence[str]) -> None:
        """Delete the ended runs' streams, meta and leases and the chat's settling mark
        (a chat deleted), and let go of those runs here."""
        keys = self.keys
        names = [keys.settling(chat_id)]
        for run_id in run_ids:
            names += [keys.events(run_id), keys.meta(run_id), keys.lease(run_id)]
        async with self.link.reaching("forget chat"):
            await self.redis.delete(*names)
        for run_id in run_ids:
            await self.release(run_id)

    async def submit(self, command: SubmitCommand) -> SubmitResult:
        return await self._mailbox.submit(command)
