"""Following the runs of other replicas: their mirrors, filled by pushes and reads.

A replica follows a run of another one through a mirror (`mirror.py`): it
subscribes to the run's channel on its one pub/sub connection (`subscriber.py`)
first, then reads the stream so far (`XRANGE`); the pushes fill the mirror from
there, duplicates dropped. The stream stays the record: a gap in the pushed seqs, a
new pub/sub connection (the last one cut, also by Redis for a full output buffer)
or a followed run that made no progress has the mirror read its stream again
after its last event. A followed run that made no progress for a quarter of the
lease has its owner checked (`leases.py`); one whose stream and meta Redis lost
(it restarted empty) is awaited while owners may re-assert their runs (`epoch.py`:
its owner then appends its whole stream again, and the mirror goes on from where
it was), and ends for its followers with `run.error` `BUS_UNAVAILABLE` when nobody
did.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from redis.exceptions import RedisError

from service.core.errors import BusUnavailable
from service.core.events import Event
from service.core.ids import valid_run_id
from service.state.redis import scripts
from service.state.redis.leases import Leases, closing_events
from service.state.redis.link import Link
from service.state.redis.meta import events_of, text
from service.state.redis.mirror import Mirror
from service.state.redis.scripts import ENDED
from service.state.redis.subscriber import Subscriber

log = logging.getLogger("agw.bus")

MIRROR_LINGER_S = 10.0  # a mirror nobody follows is dropped after this long


class Mirrors:
    """The runs of other replicas that this one follows, by id."""

    def __init__(self, link: Link, leases: Leases, reconnected: Callable[[], None]) -> None:
        """`reconnected` is called on each new pub/sub connection (Redis may have restarted)."""
        self._link = link
        self._leases = leases
        self._reconnected = reconnected
        self._mirrors: dict[str, Mirror] = {}
        self._loading: dict[str, asyncio.Task[Mirror | None]] = {}  # mirrors being made
        self._channels: dict[bytes, Mirror] = {}  # channel -> the mirror its pushes fill
        self._subscriber = Subscriber(
            link.own_connection, self._pushed, self._resubscribed, link.check_s
        )
        self._tasks: set[asyncio.Task[None]] = set()  # streams being read after a lost push

    @property
    def tasks(self) -> list[asyncio.Task[Any]]:
        """The reads and loads under way (stopped at close)."""
        return [*self._tasks, *self._loading.values()]

    async def close(self) -> None:
        """Once the tasks are stopped: nothing more comes to any mirror."""
        await self._subscriber.close()
        self._channels.clear()  # the subscriber is closed: nothing to unsubscribe from
        for mirror in self._mirrors.values():
            mirror.finish()

    async def follow(self, run_id: str, after_seq: int) -> AsyncGenerator[Event, None] | None:
        """The events of the run of another replica; None when the run is unknown."""
        async with self._link.reaching("follow"):
            mirror = await self._mirror(run_id)
        return mirror.follow(after_seq) if mirror is not None else None

    async def _mirror(self, run_id: str) -> Mirror | None:
        """The run of another replica as this one follows it (read so far); None: unknown."""
        mirror = self._mirrors.get(run_id)
        if mirror is not None or not valid_run_id(run_id):
            return mirror
        loading = self._loading.get(run_id)
        if loading is None:  # one load per run, whoever asks meanwhile
            loading = asyncio.create_task(self._load_mirror(run_id))
            self._loading[run_id] = loading
            loading.add_done_callback(lambda _: self._loading.pop(run_id, None))
        return await asyncio.shield(loading)

    async def _load_mirror(self, run_id: str) -> Mirror | None:
        """Subscribe to the run's channel, then read its stream: an event is in one or the
        other (or both: the mirror drops duplicates)."""
        link, keys = self._link, self._link.keys
        mirror = Mirror(run_id)
        mirror.on_done = self._unsubscribe  # nothing more to push once the run ended
        channel = keys.channel(run_id).encode()
        self._channels[channel] = mirror  # what is pushed from now on waits in it
        try:
            await self._subscriber.subscribe(channel)
            connection = self._subscriber.connections
            pipe = link.redis.pipeline(transaction=True)  # what is there, and the status, at once
            pipe.xrange(keys.events(run_id))
            pipe.hget(keys.meta(run_id), "status")
            entries, status = await pipe.execute()
        except BaseException:
            self._unsubscribe(mirror)
            raise
        if status is None and not entries:
            self._unsubscribe(mirror)
            return None
        gap = mirror.load(events_of(entries), done=status is None or text(status) == ENDED)
        if gap or connection != self._subscriber.connections:  # pushes may have been lost
            self._catch_up(mirror)
        mirror.on_idle = self._idle_mirror
        self._mirrors[run_id] = mirror
        return mirror

    def _unsubscribe(self, mirror: Mirror) -> None:
        channel = self._link.keys.channel(mirror.run_id).encode()
        if self._channels.get(channel) is mirror:
            del self._channels[channel]
            self._subscriber.unsubscribe(channel)

    def _idle_mirror(self, mirror: Mirror) -> None:
        if mirror.done:  # a run still going keeps its mirror a while, for re-attaching
            self._drop_mirror(mirror)

    def _drop_mirror(self, mirror: Mirror) -> None:
        self._unsubscribe(mirror)
        if self._mirrors.get(mirror.run_id) is mirror:
            del self._mirrors[mirror.run_id]

    def _pushed(self, channel: bytes, data: bytes) -> None:
        """Events an owner appended, pushed on the run's channel: into its mirror."""
        mirror = self._channels.get(channel)
        if mirror is None:
            return  # unsubscribed meanwhile
        gap = mirror.offer(scripts.unpack_pushed(data))
        if gap and mirror.loaded:  # a push was lost: read the stream from the mirror's last
            self._catch_up(mirror)

    def _resubscribed(self) -> None:
        """A new pub/sub connection has every channel again: what was pushed meanwhile is
        read from the streams."""
        self._reconnected()
        for mirror in self._channels.values():
            if mirror.loaded and not mirror.done:
                self._catch_up(mirror)

    def _catch_up(self, mirror: Mirror) -> None:
        if mirror.catching_up or mirror.done:
            return
        mirror.catching_up = True
        task = asyncio.create_task(self._read_after(mirror))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read_after(self, mirror: Mirror) -> None:
        """Read the mirror's stream after its last event, until no push waits behind a gap
        (a failure is left to the check of the mirrors that make no progress)."""
        try:
            for _ in range(3):
                entries = await self._link.redis.xrange(
                    self._link.keys.events(mirror.run_id), min=f"(0-{mirror.last}"
                )
                gap = mirror.extend(events_of(entries))
                if not gap or not entries:
                    return
        except (RedisError, OSError) as error:
            log.warning("run %s: cannot read its stream (%s)", mirror.run_id, error)
        finally:
            mirror.catching_up = False

    async def read_pushed(self) -> None:
        """The pub/sub connection's life (see `Subscriber`)."""
        await self._subscriber.run()

    async def watch(self) -> None:
        """Twice per check period: look at the followed runs."""
        await asyncio.sleep(self._link.check_s / 2)
        await self._check_mirrors()

    async def _check_mirrors(self) -> None:
        """Look at the owners of the followed runs that made no progress for a while, and
        drop the mirrors nobody followed for a while."""
        keys, now = self._link.keys, time.monotonic()
        for mirror in list(self._mirrors.values()):
            unfollowed = mirror.followers == 0 and now - mirror.idle_since > MIRROR_LINGER_S
            if unfollowed or (mirror.done and now - mirror.progress_at > MIRROR_LINGER_S):
                self._drop_mirror(mirror)  # a reader still on a mirror that is done keeps it
        check_s = self._link.check_s
        stalled = [
            m for m in self._mirrors.values() if not m.done and now - m.progress_at >= check_s
        ]
        if not stalled:
            return
        pipe = self._link.redis.pipeline(transaction=True)
        for mirror in stalled:
            pipe.xrange(keys.events(mirror.run_id), min=f"(0-{mirror.last}", count=1)
            pipe.hget(keys.meta(mirror.run_id), "status")
            pipe.exists(keys.lease(mirror.run_id))
        pipe.exists(keys.reclaiming)
        *results, reclaiming = await pipe.execute()
        for n, mirror in enumerate(stalled):
            entries, status, leased = results[3 * n : 3 * n + 3]
            mirror.progress_at = now
            if entries:  # pushes were lost: read them from the stream
                self._catch_up(mirror)
            elif status is None and mirror.events and reclaiming:
                continue  # Redis lost the run; its owner may yet re-assert it (epoch.py)
            elif status is None and mirror.events:  # Redis lost the run, and nobody has it
                mirror.extend(vanished(mirror))
            elif status is None or text(status) == ENDED:
                mirror.finish()  # nothing after what was read, and nothing more will come
            elif not leased:
                self._leases.declare_soon(mirror.run_id)


def vanished(mirror: Mirror) -> list[Event]:
    """How a follower sees a run end whose stream and meta Redis lost (it restarted empty):
    the open blocks' ends and `run.error` BUS_UNAVAILABLE; the run's log, once it ended on
    the replica that executed it, is in the run log."""
    error = BusUnavailable(
        "the run bus (Redis) lost this run's events; attach again for the run's log",
        operation="follow",
    )
    return closing_events(mirror.run_id, mirror.events[0].chat_id, mirror.events, error)
