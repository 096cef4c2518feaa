"""Redis's epoch: telling that Redis lost its data, and re-asserting this replica's claims.

A Redis restarted empty forgets every claim, meta hash, lease and stream: without
more, another replica would claim a chat whose run still goes on here, and two
runs would write into one chat. So Redis holds an *epoch*, a random token
(`Keys.epoch`), which whoever finds it missing sets anew (a script: one of them
wins), marking `Keys.reclaiming` for a lease's time. Each replica remembers the
epoch its runs were registered in:

- *Its owner re-asserts a run* when it finds a new epoch — on a new pub/sub
  connection (Redis came back), when its lease or an append finds the run gone,
  or before registering a run — before anything else of it: the chat's claim,
  the run's meta (status, fence, waits) and lease, in one script per run, then
  its whole stream again from the run's log (the outbox appends it: events
  already there are skipped, followers drop the duplicates). A run whose chat
  another run claimed meanwhile (its owner was not heard from within the
  window) is fenced here, as a lost owner's is.
- *Nobody else claims a chat with records* while `reclaiming` lasts (the
  `REGISTER` script answers 'wait'; a new chat cannot have a claim to lose):
  a live owner renews every third of its lease and re-asserts at the latest
  then, so a claim that is not back within a lease has no live owner.
- A follower does not end a followed run whose meta vanished while owners may
  still re-assert it (`mirrors.py`).

A new Redis (the first start) looks the same as one that lost its data: the first
registrations of chats that have records wait for the window then too.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable

from service.core.run.waits import Waits
from service.state.redis import scripts
from service.state.redis.link import UNREACHABLE, Link
from service.state.redis.meta import text, waits_json
from service.state.redis.outbox import Outbox
from service.state.redis.owned import Owned, OwnedRuns

log = logging.getLogger("agw.bus")


class Epoch:
    """The epoch this replica's runs are registered in, and their re-assertion."""

    def __init__(
        self,
        link: Link,
        runs: OwnedRuns,
        waits: Waits,
        outbox: Outbox,
        fence: Callable[[Owned], None],
    ) -> None:
        self._link = link
        self._runs = runs
        self._waits = waits
        self._outbox = outbox
        self._fence = fence
        self._epoch = link.redis.register_script(scripts.EPOCH)
        self._reassert = link.redis.register_script(scripts.REASSERT)
        self.token = ""  # the epoch this replica's runs are in
        self._checking = asyncio.Lock()
        self._soon: asyncio.Task[None] | None = None

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The check under way (`check_soon`)."""
        return [self._soon] if self._soon is not None else []

    @staticmethod
    def new_token() -> str:
        return secrets.token_hex(8)

    async def check(self) -> None:
        """Return once this replica's runs are in Redis's epoch: when Redis has a new one,
        re-assert them all first (a failure to reach Redis is raised)."""
        await self._link.writable()
        async with self._checking:
            while True:
                keys = self._link.keys
                args: list[str | int] = [self.new_token(), self._link.lease_ms]
                epoch = text(await self._epoch(keys=[keys.epoch, keys.reclaiming], args=args))
                # A new epoch: Redis lost every run. The same one: those found gone (their
                # keys dropped one by one, as by an eviction) are re-asserted alone.
                every = epoch != self.token
                if await self._reassert_all(epoch, every):
                    self.token = epoch
                    return

    def check_soon(self) -> None:
        """`check` in a task of its own (one at a time; a failure is logged: the next
        renewal, append or registration checks again)."""
        if self._soon is None or self._soon.done():
            self._soon = asyncio.create_task(self._check_logged(), name="epoch-check")

    async def _check_logged(self) -> None:
        try:
            await self.check()
        except UNREACHABLE as error:
            log.warning("replica %s: cannot check Redis's epoch (%s)", self._link.replica_id, error)

    def lost(self, owned: Owned) -> None:
        """Redis no longer knows the run (its meta is gone): hold its events until it is
        re-asserted, and check the epoch."""
        if owned.live and not owned.restore:
            owned.restore = True
            owned.drained.clear()
        self.check_soon()

    async def _reassert_all(self, epoch: str, every: bool) -> bool:
        """Re-assert the live runs of this replica in `epoch` (`every` one, else those
        found gone); False when the epoch changed meanwhile (to be done again). No append
        is under way meanwhile: one that reached Redis after the run's meta came back
        would start its stream after a hole."""
        link, keys = self._link, self._link.keys
        async with self._outbox.paused():
            owned = [o for o in self._runs.live() if every or o.restore]
            if not owned:
                return True
            log.warning(
                "replica %s: Redis lost its data (%s); re-asserting %d run(s)",
                link.replica_id,
                "a new epoch" if every else "runs gone",
                len(owned),
            )
            pipe = link.redis.pipeline(transaction=False)
            for o in owned:
                run = o.run
                await self._reassert(  # queued in the pipeline, which loads the script
                    keys=[*keys.claiming(run.run_id, run.chat_id), keys.epoch],
                    args=[
                        *link.claim_argv(run),
                        epoch,
                        o.fence,
                        waits_json(self._waits.open_waits(run.run_id)),
                    ],
                    client=pipe,
                )
            results = [int(result) for result in await pipe.execute()]
            if -1 in results:
                return False
            for o, result in zip(owned, results, strict=True):
                if result == 1:
                    log.info("run %s: re-asserted in Redis", o.run.run_id)
                    self._outbox.resend(o)
                else:
                    log.warning(
                        "run %s: its chat was claimed by another run while Redis had lost it",
                        o.run.run_id,
                    )
                    self._fence(o)
        return True
