"""The file `RunLog`: event logs of ended runs on disk, to re-attach after a run left memory.

Each run's complete log is written once when the run ends, as length-delimited
`agw.v1.Event` messages in `{dir}/{runId}.events` (written to a temporary file
and renamed, so a reader never sees half a log). Files older than the
archive's time-to-live are pruned at start-up and then hourly.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from google.protobuf.internal.decoder import _DecodeVarint32  # type: ignore[attr-defined]
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]

from service.core.events import Event
from service.core.ids import valid_run_id

log = logging.getLogger("agw.store")


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


class FileRunLog:
    """Writes and reads the event logs of ended runs, one file each."""

    def __init__(self, directory: Path, ttl_s: float) -> None:
        self.directory = directory
        self.ttl_s = ttl_s
        self._last_prune = 0.0

    def _path(self, run_id: str) -> Path | None:
        return self.directory / f"{run_id}.events" if valid_run_id(run_id) else None

    async def open(self) -> None:
        await asyncio.to_thread(self.prune)

    async def save(self, run_id: str, events: Sequence[Event]) -> None:
        path = self._path(run_id)
        if path is None:
            return
        await asyncio.to_thread(self._write, path, encode_events(events))
        if time.monotonic() - self._last_prune > 3600:
            await asyncio.to_thread(self.prune)

    def _write(self, path: Path, data: bytes) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_bytes(data)
        os.replace(temporary, path)

    async def close(self) -> None:
        return None

    async def load(self, run_id: str) -> list[Event] | None:
        """The run's events, or None when the run was never archived (or was pruned)."""
        path = self._path(run_id)
        if path is None or not path.exists():
            return None
        return decode_events(await asyncio.to_thread(path.read_bytes))

    def prune(self) -> int:
        """Delete the logs older than the time-to-live; returns how many."""
        self._last_prune = time.monotonic()
        if not self.directory.exists():
            return 0
        horizon = time.time() - self.ttl_s
        removed = 0
        for path in self.directory.glob("*.events"):
            try:
                if path.stat().st_mtime < horizon:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        if removed:
            log.info("pruned %d archived run logs older than %.0fs", removed, self.ttl_s)
        return removed
