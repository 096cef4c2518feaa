"""A Redis connection read by a protocol: what arrives is handled as it is read.

The outbox and the pub/sub reader each hold one connection of their own, busy with
every event of the replica's runs. Through redis-py's asyncio connection each reply
costs a task's wake-up, a read time-out armed and cancelled, and the layers of its
parser; here the loop hands each read straight to `data_received`, where hiredis
splits it into replies, and each reply goes to `on_reply` at once (many replies read
at once are handled in that one call). Commands are written with `send`, which does
not wait: the transport writes at once and keeps what the socket does not take.

redis-py still makes the connection — TCP, TLS or a unix socket, AUTH, SELECT, the
client's name — so that the URL means what it means to the rest of the bus; then its
transport is taken over (`set_protocol`) and redis-py's stream left unused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import hiredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError

from service.state.redis.packing import pack_command

log = logging.getLogger("agw.bus")

#: A reply as hiredis gives it: bytes, int, None, a list of replies, or a `ReplyError`.
Reply = Any
ReplyError = hiredis.ReplyError


class Wire(asyncio.Protocol):
    """One connection to Redis, made by `connect`: commands sent with `send`, each reply
    handed to `on_reply` as soon as it is read, in order."""

    def __init__(self, on_reply: Callable[[Reply], None]) -> None:
        self.on_reply = on_reply
        self.on_writable: Callable[[], None] | None = None  # the transport drained again
        self._reader = hiredis.Reader()
        self._transport: asyncio.Transport | None = None
        self._stream: object = None  # redis-py's stream writer of the transport
        self._lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.writable = True  # False while the transport holds too much (pause_writing)
        self.received = 0  # reads so far (a silent connection keeps it unchanged)

    @property
    def connected(self) -> bool:
        return self._transport is not None and not self._lost.done()

    @property
    def lost(self) -> asyncio.Future[None]:
        """Done (with the error, if any) once the connection is lost or closed."""
        return self._lost

    async def connect(self, connection: AbstractConnection) -> None:
        """Connect `connection` (redis-py: handshake included), then read it here."""
        await connection.connect()  # type: ignore[no-untyped-call]
        writer = getattr(connection, "_writer", None)
        reader = getattr(connection, "_reader", None)
        if writer is None or reader is None:  # pragma: no cover - a redis-py that changed
            await connection.disconnect(nowait=True)
            raise RedisConnectionError("cannot take over the connection redis-py made")
        transport: asyncio.Transport = writer.transport
        left = bytes(getattr(reader, "_buffer", b""))
        connection._writer = connection._reader = None  # ours now
        # Kept while the transport is used: a stream writer let go of closes its transport.
        self._stream = writer
        transport.set_protocol(self)
        self._transport = transport
        if left:  # nothing is expected before a command is sent; kept in order if it is
            self.data_received(left)
        if transport.is_closing():
            self.connection_lost(None)

    def send(self, *commands: tuple[Any, ...]) -> None:
        """Write `commands` in one write (raises `ConnectionError` when not connected)."""
        transport = self._transport
        if transport is None or self._lost.done():
            raise RedisConnectionError("the connection to Redis is closed")
        if len(commands) == 1:
            transport.write(pack_command(*commands[0])[0])
        else:
            transport.write(b"".join(pack_command(*command)[0] for command in commands))

    def abort(self, error: Exception) -> None:
        """Cut the connection at once; `lost` fails with `error`."""
        self._fail(error)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        if not self._lost.done():
            self._lost.set_result(None)

    # -- asyncio.Protocol -------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self.received += 1
        reader = self._reader
        reader.feed(data)
        try:
            while (reply := reader.gets()) is not False:
                self.on_reply(reply)
        except hiredis.ProtocolError as error:  # garbage on the wire: this connection is over
            self._fail(RedisConnectionError(f"Redis protocol error: {error}"))
        except Exception as error:
            log.exception("a reply from Redis could not be handled")
            self._fail(RedisConnectionError(f"a reply could not be handled: {error!r}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if not self._lost.done():
            error = RedisConnectionError(f"the connection to Redis was lost ({exc or 'closed'})")
            self._lost.set_exception(error)
            self._lost.exception()  # retrieved here: whoever awaits it gets it all the same

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        if self.on_writable is not None:
            self.on_writable()

    def _fail(self, error: Exception) -> None:
        if self._transport is not None:
            self._transport.abort()
        if not self._lost.done():
            self._lost.set_exception(error)
            self._lost.exception()
