"""The pub/sub connection of a replica's run bus: the channels of the runs it follows."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError, RedisError

from service.state.redis.wire import Reply, Wire

log = logging.getLogger("agw.bus")

RECONNECT_S = 0.05  # the pause before the pub/sub connection, once cut, is made again


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
        self._conn: Wire | None = None
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
            conn.send(("SUBSCRIBE", channel), ("PING", token))
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
            if dropped and conn is not None and conn.connected:
                conn.send(("UNSUBSCRIBE", *dropped))
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
        wire = Wire(self._reply)
        try:
            try:
                await wire.connect(self._connection())
                self._dropped.clear()
                commands: list[tuple[Any, ...]] = []
                if self.channels:
                    commands.append(("SUBSCRIBE", *self.channels))
                commands.append(("PING", b"resubscribed"))
                wire.send(*commands)
            except BaseException:
                self._failed = True
                raise
            self._conn = wire
            self.connections += 1
            self._failed = False
            self._connected.set()
            await self._watch(wire)
        except (RedisError, OSError) as error:
            if self._conn is not wire:  # could not connect: Redis unreachable (retried later)
                raise
            self._drop(wire)
            log.warning("the pub/sub connection was cut (%s); reconnecting", error)
            await asyncio.sleep(RECONNECT_S)  # what it missed is read from the streams
        finally:
            self._drop(wire)
            wire.close()

    def _drop(self, conn: Wire) -> None:
        """Stop using `conn`: the subscriptions waiting on it fail."""
        if self._conn is conn:
            self._conn = None
            self._connected.clear()
        for answered in self._pongs.values():
            if not answered.done():
                answered.set_exception(ConnectionError("the pub/sub connection was cut"))

    async def _watch(self, wire: Wire) -> None:
        """Until the connection is lost (raised): one silent for `idle_s` is pinged, and
        taken as cut when it stays silent for `idle_s` more."""
        pinged = False
        seen = wire.received
        while True:
            await asyncio.wait([wire.lost], timeout=self.idle_s)
            if wire.lost.done():
                wire.lost.result()
                raise ConnectionError("the pub/sub connection was closed")
            if wire.received != seen:
                seen = wire.received
                pinged = False
                continue
            if pinged:
                raise ConnectionError(f"no answer from Redis for {2 * self.idle_s:g} s")
            wire.send(("PING",))
            pinged = True

    def _reply(self, reply: Reply) -> None:
        """What the connection read: pushed messages, and answers to pings."""
        if not isinstance(reply, list):
            return  # an error answering an (un)subscription: the connection goes on
        kind = reply[0]
        if kind == b"message":
            self._pushed(reply[1], reply[2])
        elif kind == b"pong":
            if reply[1] == b"resubscribed":
                self._resubscribed()
            elif (answered := self._pongs.get(reply[1])) is not None and not answered.done():
                answered.set_result(None)
