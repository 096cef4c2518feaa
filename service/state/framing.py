"""A run's events as bytes, as both run logs keep them (`files/run_log.py`, `postgres/`).

Length-delimited `agw.v1.Event` messages: before each, its size as a varint, as
protobuf's own delimited streams write them.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.internal.decoder import _DecodeVarint32  # type: ignore[attr-defined]
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]

from service.core.events import Event

#: The varint prefix of every length up to 16 KiB, which nearly every event's is.
_PREFIXES = [_VarintBytes(n) for n in range(16384)]


def encode_events(events: Sequence[Event]) -> bytes:
    """`events` as length-delimited `agw.v1.Event` messages (a varint length before each)."""
    prefixes, limit = _PREFIXES, len(_PREFIXES)
    parts: list[bytes] = []
    append = parts.append
    for event in events:
        raw = event.SerializeToString()
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
