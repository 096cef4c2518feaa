"""A run's events as bytes, as both run logs keep them (`files/run_log.py`, `postgres/`).

Length-delimited `agw.v1.Event` messages: before each, its size as a varint, as
protobuf's own delimited streams write them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from google.protobuf.internal.decoder import _DecodeVarint32  # type: ignore[attr-defined]
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]

from service.core.events import Event

#: The varint prefix of every length up to 16 KiB, which nearly every event's is.
_PREFIXES = [_VarintBytes(n) for n in range(16384)]


@runtime_checkable
class Serialized(Protocol):
    """A run's events that may hold their bytes already (the run's `EventLog`)."""

    def serialized(self) -> list[bytes] | None: ...


def encode_events(events: Sequence[Event]) -> bytes:
    """`events` as length-delimited `agw.v1.Event` messages (a varint length before each).

    Events that hold their bytes already (`Serialized`, a journaled run's log) are not
    serialised again."""
    prefixes, limit = _PREFIXES, len(_PREFIXES)
    parts: list[bytes] = []
    append = parts.append
    serialized = events.serialized() if isinstance(events, Serialized) else None
    for raw in serialized if serialized is not None else (e.SerializeToString() for e in events):
        size = len(raw)
        append(prefixes[size] if size < limit else _VarintBytes(size))
        append(raw)
    return b"".join(parts)


def decode_events(data: bytes) -> list[Event]:
    """The events of `encode_events(events)`, in order."""
    events: list[Event] = []
    position = 0
    while position < len(data):
        size, position = _DecodeVarint32(data, position)
        events.append(Event.FromString(data[position : position + size]))
        position += size
    return events
