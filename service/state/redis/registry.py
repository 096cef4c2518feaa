"""Claims and the registry: which run is live, whose it is, and each chat's active run.

`register` claims the chat's active-run key and writes the run's meta hash (chat,
owner principal, owner replica, status, fence 1, agent) and its lease, in one
script, in the replica's epoch (`epoch.py`: after Redis lost its data, the replica
re-asserts its own runs first, and a chat that has records is claimed only once
owners had their time to re-assert theirs); a query meeting another replica's run
gets that run instead, after checking its owner's lease. A replica answers for the
chats of its own runs without asking Redis. The terminal event's append (the
outbox's) frees the chat and marks it *settling* until the owner's chat records are
durable (`settled`); a new run of the chat waits for that (`wait_settled`, at most
10 s).

*Waits.* The owner writes the open waits of each run (tool id, kind, tool name)
into its meta hash whenever one opens or closes (one writer loop per replica,
which writes each run's latest state), so any replica can say what a live run
waits for (`live_of`), with the stream's last entry as its last seq.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time

from service.core.errors import Conflict
from service.core.ids import Principal
from service.core.run.state import RunState
from service.core.run.waits import Waits
from service.core.values import LiveRun, OpenWait, RunRef
from service.state.redis import scripts
from service.state.redis.epoch import Epoch
from service.state.redis.leases import Leases
from service.state.redis.link import UNREACHABLE, Link
from service.state.redis.meta import open_waits, read_meta, text, waits_json
from service.state.redis.outbox import Outbox
from service.state.redis.owned import Owned, OwnedRuns
from service.state.redis.scripts import ENDED, RUNNING
from service.state.run_refs import live, ref

log = logging.getLogger("agw.bus")

SETTLE_WAIT_S = 10.0  # a new run waits at most this long for the chat's last run to settle
RECLAIM_POLL_S = 0.05  # how often a registration waiting for owners to re-assert looks again


class Registry:
    """The runs' claims, meta hashes and states, as every replica sees them."""

    def __init__(
        self,
        link: Link,
        runs: OwnedRuns,
        waits: Waits,
        leases: Leases,
        outbox: Outbox,
        epoch: Epoch,
    ) -> None:
        self._link = link
        self._runs = runs
        self._waits = waits
        self._leases = leases
        self._outbox = outbox
        self._epoch = epoch
        self._register = link.redis.register_script(scripts.REGISTER)
        self._active = link.redis.register_script(scripts.ACTIVE)
        self._compare_delete = link.redis.register_script(scripts.COMPARE_DELETE)
        self._set_waits = link.redis.register_script(scripts.SET_WAITS)
        self._adopt = link.redis.register_script(scripts.ADOPT)
        self._waits_due: dict[str, list[OpenWait]] = {}  # run id -> its waits to write
        self._waits_wake = asyncio.Event()
        waits.observe(self._waits_changed)

    # -- the owner's side --------------------------------------------------------------

    async def register(self, run: RunState, *, new_chat: bool = False) -> RunRef | None:
        clashes = 0
        while True:
            async with self._link.reaching("register"):
                status, value = await self._claim(run, new_chat)
                if status == "epoch":  # Redis lost its data: this replica's runs first
                    await self._epoch.check()
                    continue
                if status == "busy":
                    active = await self._active_of(run.chat_id)
                    if active is not None:
                        return active
                    clashes += 1  # it ended meanwhile: claim again
                    if clashes == 5:
                        raise Conflict(
                            f"chat {run.chat_id!r} changed hands too often; retry",
                            chat_id=run.chat_id,
                        )
                    continue
            if status == "wait":  # a claim Redis lost may yet be re-asserted on the chat
                await asyncio.sleep(min(int(value) / 1000, RECLAIM_POLL_S))
                continue
            owned = Owned(run, fence=1)
            run.log.observe_published(functools.partial(self._outbox.push, owned))
            self._runs.add(owned)
            return None

    async def adopt(self, run: RunState, fence: int) -> bool:
        """Own `run` from now on, whose owner was declared lost by this replica with
        `fence` (`Leases.declare_lost`): it runs here again; its stream is made whole from
        its log and goes on. False when another replica took it over meanwhile."""
        link = self._link
        async with link.reaching("adopt"):
            adopted = await self._adopt(
                keys=[link.keys.meta(run.run_id), link.keys.lease(run.run_id)],
                args=[fence, link.replica_id, link.lease_ms],
            )
        if not int(adopted):
            return False
        owned = Owned(run, fence=fence)
        run.log.observe_published(functools.partial(self._outbox.push, owned))
        self._runs.add(owned)
        self._outbox.resend(owned)  # what the lost owner had not appended yet
        return True

    async def _claim(self, run: RunState, new_chat: bool) -> tuple[str, str]:
        """The `REGISTER` script's answer for `run`: (status, value)."""
        link = self._link
        answer = await self._register(
            keys=[
                *link.keys.claiming(run.run_id, run.chat_id),
                link.keys.epoch,
                link.keys.reclaiming,
            ],
            args=[
                *link.claim_argv(run),
                self._epoch.token,
                self._epoch.new_token(),
                "0" if new_chat else "1",
            ],
        )
        return text(answer[0]), text(answer[1])

    async def ended(self, run: RunState) -> None:
        try:
            await self._end(run)
        except UNREACHABLE as error:  # the outbox appends the terminal event once Redis is back
            log.warning("run %s ended; Redis unreachable to mark it (%s)", run.run_id, error)
            self._runs.free(run.run_id)

    async def _end(self, run: RunState) -> None:
        owned = self._runs.get(run.run_id)
        if owned is not None and owned.live:
            await owned.wait_drained(self._link.reply_timeout_s)
            # No terminal event went out (the run never started); a run to be re-asserted
            # will have its terminal event appended then.
            if owned.live and not (owned.restore or owned.resend):
                link = self._link
                await link.append(
                    keys=link.keys.appending(run.run_id, run.chat_id),
                    args=link.append_argv(owned.fence, run.run_id, "", link.end_ms, 0),
                )
                owned.published_end = True
        self._runs.free(run.run_id)

    async def settled(self, run: RunState) -> None:
        owned = self._runs.get(run.run_id)
        if owned is not None and owned.fenced:
            return
        try:
            settling = self._link.keys.settling(run.chat_id)
            await self._compare_delete(keys=[settling], args=[run.run_id])
        except UNREACHABLE as error:  # the settling mark expires by itself
            log.warning("run %s settled; Redis unreachable to say so (%s)", run.run_id, error)

    def _waits_changed(self, run_id: str, waits: list[OpenWait]) -> None:
        if run_id in self._runs:
            self._waits_due[run_id] = waits
            self._waits_wake.set()

    async def write_waits(self) -> None:
        """Write the open waits of the runs whose waits changed into their meta hashes."""
        await self._waits_wake.wait()
        await self._link.writable()
        self._waits_wake.clear()
        due, self._waits_due = self._waits_due, {}
        try:
            for run_id, waits in list(due.items()):
                owned = self._runs.get(run_id)
                if owned is not None and not owned.fenced:
                    meta = self._link.keys.meta(run_id)
                    await self._set_waits(keys=[meta], args=[waits_json(waits), owned.fence])
                del due[run_id]  # written, or nothing to write any more
        finally:
            if due:  # not written (Redis unreachable): again, unless newer ones came meanwhile
                self._waits_due = {**due, **self._waits_due}
                self._waits_wake.set()

    # -- anyone's side -----------------------------------------------------------------

    async def find(self, run_id: str) -> RunRef | None:
        run = self._runs.here(run_id)
        if run is not None:
            return ref(run)
        async with self._link.reaching("find"):
            meta = await read_meta(self._link, run_id)
        return meta.ref if meta is not None else None

    async def active_of(self, chat_id: str) -> RunRef | None:
        run = self._runs.running_on(chat_id)
        if run is not None:  # this replica knows its own runs, whatever Redis says
            return ref(run)
        async with self._link.reaching("active_of"):
            return await self._active_of(chat_id)

    async def _active_of(self, chat_id: str) -> RunRef | None:
        claim = self._link.keys.claim(chat_id)
        for _ in range(5):
            found = await self._active(keys=[claim], args=[self._link.keys.prefix])
            if not found:
                return None
            run_id, chat, tenant, subject, status = (text(value) for value in found[:5])
            run = self._runs.here(run_id)
            if run is not None:
                return ref(run)
            if not status:  # the claim outlived its run's meta: drop it
                await self._compare_delete(keys=[claim], args=[run_id])
                continue
            if status != ENDED and not int(found[5]) and await self._leases.declare_lost(run_id):
                continue  # its owner was lost: the run is ended and the chat freed
            return RunRef(run_id, chat, Principal(tenant, subject), running=status != ENDED)
        return None

    async def live_of(self, chat_id: str) -> LiveRun | None:
        keys = self._link.keys
        async with self._link.reaching("live_of"):
            active = await self._active_of(chat_id)
            if active is None or not active.running:
                return None
            run = self._runs.here(active.run_id)
            if run is not None:
                return live(run, self._waits) if not run.done else None
            pipe = self._link.redis.pipeline(transaction=False)
            pipe.hmget(keys.meta(active.run_id), "status", "agent", "waits")
            pipe.xrevrange(keys.events(active.run_id), "+", "-", count=1)
            (status, agent, waits), last = await pipe.execute()
        if text(status) != RUNNING:
            return None
        last_seq = int(text(last[0][0]).partition("-")[2]) if last else 0
        return LiveRun(
            active.run_id, chat_id, active.owner, text(agent), last_seq, open_waits(waits)
        )

    async def wait_ended(self, run_id: str) -> None:
        if self._runs.here(run_id) is not None:
            await self._runs.wait_freed(run_id)
            return
        delay = 0.005
        while True:
            pipe = self._link.redis.pipeline(transaction=True)
            pipe.hget(self._link.keys.meta(run_id), "status")
            pipe.exists(self._link.keys.lease(run_id))
            async with self._link.reaching("wait_ended"):
                status, leased = await pipe.execute()
            if status is None or text(status) == ENDED:
                return
            if not leased:
                await self._leases.declare_lost(run_id)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)

    async def wait_settled(self, chat_id: str) -> None:
        deadline = time.monotonic() + SETTLE_WAIT_S
        delay = 0.002
        while True:
            async with self._link.reaching("wait_settled"):
                if not await self._link.redis.exists(self._link.keys.settling(chat_id)):
                    return
            if time.monotonic() >= deadline:
                log.warning("chat %s: its last run did not settle in %gs", chat_id, SETTLE_WAIT_S)
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
