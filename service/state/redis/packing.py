"""Redis commands packed into the wire protocol by hiredis, in C.

redis-py's asyncio connections pack every command in Python, one `encode` per
argument: for the run bus, whose outbox appends every delta, that packing was
the largest cost of the Redis hop (about a fifth of the bus's CPU, measured by `bench.redis_hop`
under cProfile). `hiredis.pack_command` writes the same bytes. Its synchronous
connections already use it; `packed` gives an asyncio connection class the
same packer, keeping everything else (TCP, TLS or unix socket) as it is.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import DataError


def pack_command(*args: Any) -> list[bytes]:
    """`args` as one RESP command: a command name holding spaces ("CONFIG GET") is sent
    as separate words, as redis-py does; a value hiredis cannot send is a `DataError`."""
    first = args[0]
    if isinstance(first, str):
        args = (*first.encode().split(), *args[1:])
    elif b" " in first:
        args = (*first.split(), *args[1:])
    try:
        return [hiredis.pack_command(_any(args))]
    except TypeError:
        pass
    buffers = tuple(bytes(a) if isinstance(a, (bytearray, memoryview)) else a for a in args)
    try:
        return [hiredis.pack_command(_any(buffers))]
    except TypeError as error:
        raise DataError(str(error)) from error


def _any(args: tuple[Any, ...]) -> Any:
    return args  # hiredis's stubs type the command as a 1-tuple


_PACKED: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def packed(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    """`connection_class`, packing its commands with hiredis (one subclass per class)."""
    made = _PACKED.get(connection_class)
    if made is None:

        def pack(self: AbstractConnection, *args: Any) -> list[bytes]:
            return pack_command(*args)

        made = type(connection_class.__name__, (connection_class,), {"pack_command": pack})
        _PACKED[connection_class] = made
    return made
