"""The run journal's events, appended to segment files: one `write` per batch, no database.

A journaled run's events are most of what its journal writes — one per delta — and each is
needed again only if the run resumes. So while a process holds its journal alone, it
appends them to `{dir}/journal-events/{n}.log`, one record per event, all of a batch in
one `os.write` to the page cache (as durable as a commit to SQLite's write-ahead log with
`synchronous=NORMAL`: a killed process loses nothing written; a power cut may lose the
last writes), instead of committing them to the database.

A record is its length, a CRC-32 of the rest, the run id's length, the event's seq, the
run id and the event's bytes; a torn record (a power cut, a full disk) ends what is read
of its segment. A segment is replaced by the next once `SEGMENT_BYTES` long (created
ahead of need, off the event loop), and deleted once no run in flight has events in it:
the events of a run older than the last `KEEP_SEGMENTS` are moved into the database
(the journal's `_settle`), so that a long run — or one parked for hours — holds no segment.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

#: A segment's size past which the next one is begun.
SEGMENT_BYTES = 8 * 1024 * 1024
#: The segments a run in flight may have events in; older ones are moved to the database.
KEEP_SEGMENTS = 2
DIRECTORY = "journal-events"

_HEAD = struct.Struct("<II")  # the length of the rest, its CRC-32
_KEY = struct.Struct("<HQ")  # the run id's length, the event's seq


def record(run_id: bytes, seq: int, data: bytes) -> bytes:
    """One event's record."""
    rest = _KEY.pack(len(run_id), seq) + run_id + data
    return _HEAD.pack(len(rest), zlib.crc32(rest)) + rest


def records(data: bytes) -> Iterator[tuple[str, int, bytes]]:
    """(run id, seq, event bytes) of each whole record of a segment's bytes, up to the first
    torn one."""
    head, key = _HEAD.size, _KEY.size
    end = len(data)
    at = 0
    while at + head <= end:
        length, crc = _HEAD.unpack_from(data, at)
        start = at + head
        stop = start + length
        if length < key or stop > end or zlib.crc32(data[start:stop]) != crc:
            return
        size, seq = _KEY.unpack_from(data, start)
        begin = start + key
        yield data[begin : begin + size].decode(), seq, data[begin + size : stop]
        at = stop


class Segments:
    """The segment files of one journal, held by one process.

    `append` runs on the event loop or on the journal's thread, one call at a time (the
    journal writes one batch at a time); `prepare`, `read`, `settled` and `drop` run on
    the journal's thread. `first` — the oldest segment each run in flight may have events
    in — is shared by both, under a lock.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory / DIRECTORY
        self.number = 0  # the segment appended to
        self._fd: int | None = None
        self._size = 0
        self._next: int | None = None  # the next segment's descriptor, created ahead
        self._preparing = False
        self._first: dict[str, int] = {}
        self._ended: set[str] = set()  # of those runs, the ones that ended (not to be moved)
        self._lock = threading.Lock()

    def path(self, number: int) -> Path:
        return self.directory / f"{number:010d}.log"

    def numbers(self) -> list[int]:
        """The segments on disk, oldest first."""
        if not self.directory.is_dir():
            return []
        return sorted(int(p.stem) for p in self.directory.glob("*.log") if p.stem.isdigit())

    def recover(self) -> Iterator[tuple[str, int, bytes]]:
        """The records of the segments a previous process left (at open, on the thread)."""
        for number in self.numbers():
            yield from records(self.path(number).read_bytes())

    def start(self) -> None:
        """Delete what `recover` read and begin a new segment (at open, on the thread)."""
        numbers = self.numbers()
        for number in numbers:
            self.path(number).unlink(missing_ok=True)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.number = (numbers[-1] if numbers else 0) + 1
        self._fd = self._create(self.number)
        self._size = 0

    def _create(self, number: int) -> int:
        return os.open(self.path(number), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    # -- appending (the loop or the thread) ------------------------------------------------

    def ready(self) -> bool:
        """Whether `append` can write without creating a file (then the loop may call it)."""
        return self._size < SEGMENT_BYTES or self._next is not None

    def needs_preparing(self) -> bool:
        """Whether the next segment should be created now, ahead of need (once)."""
        if self._next is not None or self._preparing or self._size < SEGMENT_BYTES // 2:
            return False
        self._preparing = True
        return True

    def prepare(self) -> None:
        """Create the next segment (on the thread)."""
        try:
            self._next = self._create(self.number + 1)
        finally:
            self._preparing = False

    def append(self, batch: bytes, run_ids: Iterable[str]) -> int | None:
        """Append the records of `batch` (of the events of `run_ids`); the segment it began,
        if it did (the one before it is full: `settled` then moves what is old)."""
        began = None
        if self._size >= SEGMENT_BYTES:
            began = self._rotate()
        fd = self._fd
        if fd is None:
            raise RuntimeError("the run journal's event segments are not open")
        written = 0
        try:
            while written < len(batch):
                written += os.write(fd, batch[written:] if written else batch)
        except OSError:
            if written:  # a torn record: cut back, so that the next batch follows a whole one
                os.ftruncate(fd, self._size)
            raise
        self._size += written
        first = self._first
        for run_id in run_ids:
            if run_id not in first:  # (runs are added by the writer alone: a look needs no lock)
                with self._lock:
                    first.setdefault(run_id, self.number)
        return began

    def _rotate(self) -> int:
        fd = self._next
        if fd is None:  # (on the thread: the loop only appends when `ready`)
            fd = self._create(self.number + 1)
        self._next = None
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._size = fd, 0
        self.number += 1
        return self.number

    # -- runs --------------------------------------------------------------------------

    def holds(self, run_id: str) -> int | None:
        """The oldest segment that may hold events of `run_id`, if any may."""
        with self._lock:
            return self._first.get(run_id)

    def end(self, run_id: str) -> None:
        """`run_id` ended, its rows not yet deleted: its events are kept where they are (its
        segments stay until `forget`), never moved."""
        with self._lock:
            self._ended.add(run_id)

    def forget(self, run_id: str) -> None:
        """`run_id` ended: its events are needed no more."""
        with self._lock:
            self._first.pop(run_id, None)
            self._ended.discard(run_id)

    def read(self, run_id: str, since: int) -> list[tuple[int, bytes]]:
        """(seq, bytes) of the events of `run_id` in the segments from `since` on (on the
        thread)."""
        wanted = run_id.encode()
        found: list[tuple[int, bytes]] = []
        for number in range(since, self.number + 1):
            try:
                data = self.path(number).read_bytes()
            except FileNotFoundError:
                continue
            if wanted not in data:
                continue
            found.extend((seq, event) for rid, seq, event in records(data) if rid == run_id)
        return found

    def read_runs(self, since: dict[str, int], upto: int) -> Iterator[tuple[str, int, bytes]]:
        """(run id, seq, bytes) of the events of the runs of `since`, each from the segment
        `since` gives on, up to segment `upto`: each segment read once, whatever the number
        of runs (on the thread)."""
        if not since:
            return
        for number in range(min(since.values()), upto + 1):
            try:
                data = self.path(number).read_bytes()
            except FileNotFoundError:
                continue
            for run_id, seq, event in records(data):
                first = since.get(run_id)
                if first is not None and first <= number:
                    yield run_id, seq, event

    def old(self) -> dict[str, int]:
        """The runs with events in a segment older than the last `KEEP_SEGMENTS`, and the
        newest segment closed (to be moved into the database: `settled`)."""
        oldest = self.number - KEEP_SEGMENTS + 1
        with self._lock:
            ended = self._ended
            return {r: n for r, n in self._first.items() if n < oldest and r not in ended}

    def settled(self, run_ids: Iterable[str], upto: int) -> None:
        """The events of `run_ids` in the segments up to `upto` are in the database now."""
        with self._lock:
            first = self._first
            for run_id in run_ids:
                if run_id in first:
                    first[run_id] = max(first[run_id], upto + 1)

    def drop(self) -> None:
        """Delete the segments no run in flight has events in (on the thread)."""
        with self._lock:
            keep = min(self._first.values(), default=self.number)
        for number in self.numbers():
            if number >= min(keep, self.number):
                break
            self.path(number).unlink(missing_ok=True)

    def close(self) -> None:
        for fd in (self._fd, self._next):
            if fd is not None:
                os.close(fd)
        self._fd = self._next = None
