"""Leases and owner loss: a replica's hold on the runs it executes, and what ends it.

The owner renews the lease of each live run every third of its time to live, and
its own liveness key with them. The mirrors' check (for a followed run that made
no progress for a quarter of the lease), a query meeting the chat's active run, a
Submit or a Cancel, `wait_ended`, and each replica's janitor (every lease period,
over the runs not ended) check the lease; when it has expired, one of them
declares the owner lost atomically (the lease is gone and the run has not ended:
the fence is incremented, the status is `lost`, the declarer holds the lease),
resumes the run when the service journals its runs (`resume`: the run goes on on the
declarer, from its journal), else replays the stream to find the blocks still open, and
appends their `*.end`s and a terminal `run.error` with reason `OWNER_LOST` — with the new
fence, and only if the stream still ends where it read it. A declarer that dies in
between lets its lease expire and another one does it again.

An owner that comes back has its appends and renewals refused by the fence: it
cancels its run (reason "fenced") and writes nothing more of it (`RunState.fenced`).

*Hand-over.* A draining owner stops the runs that can resume elsewhere and hands each
over (`hand_over`): once its events are appended, the `HANDOVER` script moves the fence
on, lets the lease go, marks the run and queues its id; every replica not draining waits
on that queue (`take_handed_over`), and the one that pops the id declares the run lost
and resumes it at once (reason `drain`), with no lease to wait out. A run nobody pops
(every replica drains) is found by the janitors as any run without a lease. A draining
replica declares no run lost (it would resume it only to hand it over again).
An owner whose run Redis no longer knows (it restarted empty) re-asserts it
(`epoch.py`); followers elsewhere end a run that nobody re-asserts in time
(`mirrors.vanished`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence

from redis.exceptions import NoScriptError

from service.core import events
from service.core.errors import AgwError, OwnerLost
from service.core.events import BLOCK_ENDS, BLOCKS, EVENT_TYPES, Event
from service.state.redis import scripts
from service.state.redis.link import INBOX_POLL_S, Link
from service.state.redis.meta import events_of, read_meta, text
from service.state.redis.owned import Owned, OwnedRuns

log = logging.getLogger("agw.bus")

DRAINING_MS = 3_600_000  # a draining replica's mark outlives any drain (deleted at close)


class Leases:
    """The leases of this replica's runs, and the ending of runs whose owner was lost."""

    def __init__(self, link: Link, runs: OwnedRuns, gone: Callable[[Owned], None]) -> None:
        """`gone` is told of a run of this replica that Redis no longer knows."""
        self._link = link
        self._runs = runs
        self._gone = gone
        self._renew = link.redis.register_script(scripts.RENEW)
        self._declare = link.redis.register_script(scripts.DECLARE)
        self._hand_over = link.redis.register_script(scripts.HANDOVER)
        self._declaring: set[asyncio.Task[bool]] = set()
        # Asked to resume a run this replica declared lost (its fence given, and the reason:
        # `owner_lost`, or `drain` for a run handed over): True when it goes on here; the
        # run is ended OWNER_LOST otherwise (`RunBus.on_lost`).
        self.resume: Callable[[str, int, str], Awaitable[bool]] | None = None
        self.draining = False  # this replica stops: it takes no run over

    @property
    def tasks(self) -> list[asyncio.Task[bool]]:
        """The declarations under way (`declare_soon`)."""
        return list(self._declaring)

    async def renew(self) -> None:
        """After a third of the lease: renew the leases of the live runs, and this replica's
        liveness (and its place in the set of replicas); a run whose fence changed was taken
        over, and is fenced here."""
        link = self._link
        await asyncio.sleep(link.lease_ttl_s / 3)
        await link.writable()
        owned = self._runs.live()
        pipe = link.redis.pipeline(transaction=False)
        pipe.set(link.keys.alive(link.replica_id), "1", px=link.lease_ms)
        pipe.sadd(link.keys.replicas, link.replica_id)  # again, if Redis lost its data
        for o in owned:
            run_id = o.run.run_id
            lease = f"{link.replica_id}:{o.fence}"
            keys = (link.keys.meta(run_id), link.keys.lease(run_id))
            pipe.evalsha(self._renew.sha, 2, *keys, o.fence, lease, link.lease_ms)
        results = await pipe.execute(raise_on_error=False)
        if any(isinstance(result, NoScriptError) for result in results):
            await link.redis.script_load(scripts.RENEW)
            return
        for o, renewed in zip(owned, results[2:], strict=True):
            if isinstance(renewed, Exception):
                log.warning("cannot renew the lease of run %s (%s)", o.run.run_id, renewed)
            elif int(renewed) == scripts.GONE:
                self._gone(o)
            elif not int(renewed):
                self.fence(o)

    def fence(self, owned: Owned) -> None:
        """Another replica declared this one lost for the run: stop it here, write nothing."""
        if owned.fenced or owned.handed_over:
            return
        owned.fenced = True
        owned.run.fenced = True
        owned.pending.clear()
        owned.drained.set()
        log.warning(
            "run %s was taken over by another replica (this one was declared lost); "
            "cancelling it here",
            owned.run.run_id,
        )
        owned.run.cancel("fenced")
        self._runs.free(owned.run.run_id)

    async def lost(self, run_id: str) -> bool:
        """Whether the run's owner is gone: if so, the run is ended as lost (by anyone)."""
        if await self._link.redis.exists(self._link.keys.lease(run_id)):
            return False
        await self.declare_lost(run_id)
        return True

    def declare_soon(self, run_id: str) -> None:
        """`declare_lost` in a task of its own (stopped at close)."""
        task = asyncio.create_task(self.declare_lost(run_id))
        self._declaring.add(task)
        task.add_done_callback(self._declaring.discard)

    async def declare_lost(self, run_id: str) -> bool:
        """End the run as lost when its owner's lease expired (or it was handed over): resume
        it here, or end it OWNER_LOST; True when this replica did. A draining replica does
        not (another one will)."""
        if self.draining:
            return False
        link = self._link
        fence, handed = (
            int(value)
            for value in await self._declare(
                keys=[link.keys.meta(run_id), link.keys.lease(run_id), link.keys.active],
                args=[run_id, link.replica_id, link.lease_ms],
            )
        )
        if not fence:
            return False
        if self.resume is not None:
            reason = "drain" if handed else "owner_lost"
            try:
                if await self.resume(run_id, fence, reason):
                    if handed:
                        log.info("run %s: handed over by a draining replica; resumed here", run_id)
                    else:
                        log.warning(
                            "run %s: its replica was lost (its lease expired); resumed here",
                            run_id,
                        )
                    return True
            except Exception:
                log.exception("run %s: could not resume it; ending it OWNER_LOST", run_id)
        meta = await read_meta(link, run_id)
        if meta is None:
            return False
        logged = events_of(await link.redis.xrange(link.keys.events(run_id)))
        lost = OwnerLost(
            f"replica {meta.replica} executing the run was lost (its lease expired)",
            replica=meta.replica,
        )
        closing = closing_events(meta.run_id, meta.chat_id, logged, lost)
        top = logged[-1].seq if logged else 0
        lost_ms = round(link.lost_ttl_s * 1000)
        args = link.append_argv(fence, run_id, top, lost_ms, 0, closing)
        keys = link.keys.appending(run_id, meta.chat_id)
        appended = int(await link.append(keys=keys, args=args)) == 1
        if appended:
            log.warning(
                "run %s: replica %s was lost (its lease expired); ended the run as OWNER_LOST",
                run_id,
                meta.replica,
            )
        return appended

    async def hand_over(self, owned: Owned) -> bool:
        """Let another replica take `owned` over at once (this one drains, the run stopped
        here without an end): once what it published is appended, the `HANDOVER` script.
        False when the run was not this replica's any more."""
        link = self._link
        run_id = owned.run.run_id
        if not owned.live:
            return False
        await owned.wait_drained(link.reply_timeout_s)
        owned.handed_over = True  # no renewal, no append from now on
        async with link.reaching("hand over"):
            handed = await self._hand_over(
                keys=[link.keys.meta(run_id), link.keys.lease(run_id), link.keys.handovers],
                args=[owned.fence, run_id],
            )
        return bool(int(handed))

    async def drain(self) -> None:
        """This replica stops: it takes no run over from now on, and says so (for
        `others_up`)."""
        self.draining = True
        link = self._link
        async with link.reaching("drain"):
            await link.redis.set(link.keys.draining(link.replica_id), "1", px=DRAINING_MS)

    async def others_up(self) -> bool:
        """Whether another replica is up (its liveness key) and not draining; the replicas
        found down are pruned from the set of replicas."""
        link, keys = self._link, self._link.keys
        async with link.reaching("find replicas"):
            members = [text(m) for m in await link.redis.smembers(keys.replicas)]
            others = [m for m in members if m != link.replica_id]
            if not others:
                return False
            pipe = link.redis.pipeline(transaction=False)
            for replica in others:
                pipe.exists(keys.alive(replica))
                pipe.exists(keys.draining(replica))
            found = await pipe.execute()
            states = list(zip(others, found[0::2], found[1::2], strict=True))
            down = [replica for replica, alive, _ in states if not alive]
            if down:
                await link.redis.srem(keys.replicas, *down)
        return any(alive and not draining for _, alive, draining in states)

    async def take_handed_over(self) -> None:
        """Wait (a poll period at most) for a run a draining replica handed over, and take
        it over: declared lost here, it resumes here (in a task of its own)."""
        link = self._link
        if self.draining:
            await asyncio.sleep(INBOX_POLL_S)
            return
        item = await link.redis.blpop([link.keys.handovers], timeout=INBOX_POLL_S)
        if item is None:
            return
        run_id = text(item[1])
        if self.draining:  # this replica began to drain meanwhile: for another one
            await link.redis.lpush(link.keys.handovers, run_id)
            return
        self.declare_soon(run_id)

    async def janitor(self) -> None:
        """About every lease period: end the runs of other replicas whose lease expired,
        also those nobody follows."""
        link = self._link
        await asyncio.sleep(link.lease_ttl_s * (0.75 + secrets.randbelow(500) / 1000))
        members = await link.redis.smembers(link.keys.active)
        others = [text(m) for m in members if text(m) not in self._runs]
        if not others:
            return
        pipe = link.redis.pipeline(transaction=False)
        for run_id in others:
            pipe.exists(link.keys.lease(run_id))
        leased = await pipe.execute()
        for run_id, alive in zip(others, leased, strict=True):
            if not alive:
                await self.declare_lost(run_id)


def closing_events(
    run_id: str, chat_id: str, logged: Sequence[Event], error: AgwError
) -> list[Event]:
    """The `*.end`s of the blocks `logged` leaves open (innermost first) and a terminal
    `run.error` of `error`, numbered after the last logged event."""
    open_blocks: dict[str, Event] = {}
    for event in logged:
        name = event.WhichOneof("payload")
        if name in BLOCKS:
            open_blocks[getattr(getattr(event, name), BLOCKS[name][1])] = event
        elif name in BLOCK_ENDS:
            open_blocks.pop(getattr(getattr(event, name), BLOCK_ENDS[name]), None)
    closing = [events.end_of(start) for start in reversed(open_blocks.values())]
    closing.append(events.run_error(error.reason, error.message, error.metadata))
    seq = logged[-1].seq if logged else 0
    now = time.time_ns() // 1_000_000
    for event in closing:
        seq += 1
        event.seq = seq
        event.type = EVENT_TYPES[event.WhichOneof("payload") or ""]
        event.timestamp = now
        event.chat_id = chat_id
        event.run_id = run_id
    return closing
