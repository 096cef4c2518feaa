"""The JSONL `ChatStore`: `{dir}/{chatId}.json`, one record per line.

Durability and crash safety:
- Each record is one `write()` of one line on an `O_APPEND` descriptor.
- An append writes all of its bytes or fails loudly (`StoreFailed`): a write may
  store part of its buffer without raising (seen on a full disk), so the count is
  checked and the rest written; when that fails (no space left), the file is cut
  back to where the append began, so it still ends on a line boundary and the
  next append starts a line of its own. A new chat's file whose first append
  failed is removed. Should the cut itself fail, the next append checks the tail
  first (below).
- A crash (kill -9) in the middle of a write can still leave a torn last line.
  Before its first append to a file, the store checks that the file ends with a
  newline; if not, the torn fragment is moved to `{chatId}.json.torn` and cut
  off, so the next record is never glued to it.
- fsync policy (`fsync`): "run" (default) fsyncs a chat's file at the end of
  each run, "always" after every append, "never" leaves it to the OS. A failed
  fsync marks the file failed: it is never retried and further appends to that
  chat are refused (the PostgreSQL fsyncgate lesson).
- On read, a line that is not a JSON object is reported (file and line number)
  and skipped, never fatal. Old field names are read: `planSnapshot` → `plan`,
  and a plan's `plan` list → `tasks`.
- One process writes a directory; appends to one chat keep their call order. What
  may cost the disk more than microseconds — creating a new chat's file, checking the
  tail of a file written before, fsync, reading, deleting — runs in a disk writer
  thread (`writer.py`), never on the event loop; the fsyncs of the runs ending
  together go to the thread as one batch. An append to a file this process created
  or checked, with nothing of its chat waiting in the thread, is one `write` from the
  loop (page cache: microseconds), so that a full disk fails the run at once. A new
  chat's first records are lazy in the thread, unless every append is fsynced: they
  wait up to the writer's `lazy_s` for more work — a short run's end, whose records,
  fsync and log then go in the same batch, the file created, written and fsynced at
  once — or for a read of the chat, which takes them along. Until then, a process that
  dies loses them from the file (the run's journal holds its query). A chat
  is listed (`summary`, `page`) as soon as its first record is handed to the store; a
  record whose append fails is taken out of its chat's summary again.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, TypeVar

import orjson

from service.core.errors import ChatNotFound, StoreFailed
from service.core.ids import ANONYMOUS, Principal, check_chat_id, valid_chat_id
from service.core.values import ChatSummary, Record
from service.state.files.writer import DiskWriter
from service.state.summaries import expired_of, page_of, summarize

log = logging.getLogger("agw.store")

T = TypeVar("T")

FsyncPolicy = Literal["run", "always", "never"]

#: The kinds of chat records: a run's query and steps, and a change of the chat (a rename).
RECORD_TYPES = frozenset({"query", "step", "update"})


def upgrade_record(record: Record) -> Record:
    """Read compatibility with older field names."""
    if "plan" not in record and "planSnapshot" in record:
        record["plan"] = record.pop("planSnapshot")
    plan = record.get("plan")
    if isinstance(plan, dict) and "tasks" not in plan and isinstance(plan.get("plan"), list):
        plan["tasks"] = plan.pop("plan")
    return record


class JsonlChatStore:
    """The JSONL implementation of `ChatStore`."""

    def __init__(
        self, directory: Path, *, fsync: FsyncPolicy = "run", writer: DiskWriter | None = None
    ) -> None:
        self.directory = directory
        self.fsync = fsync
        self._writer = writer if writer is not None else DiskWriter(name="agw-chats")
        self._summaries: dict[str, ChatSummary] = {}  # of the records written
        self._unwritten: dict[str, list[list[Record]]] = {}  # records handed over, not written
        self._queued: dict[str, int] = {}  # per chat, its work in the writer not done yet
        # Kept by the writer's thread (and read, added to by appends on the loop):
        self._checked: set[str] = set()
        self._failed: set[str] = set()
        self._dirty: set[str] = set()
        self._paths: dict[str, str] = {}

    def path(self, chat_id: str) -> Path:
        return self.directory / f"{check_chat_id(chat_id)}.json"

    def _written_path(self, chat_id: str) -> str:
        """The file of a chat this store writes, made once (a run writes to it three times;
        only chats written to are remembered, never ids merely looked up), as a string: a
        `Path` kept for every chat costs three times its length."""
        path = self._paths.get(chat_id)
        if path is None:
            path = self._paths[chat_id] = os.fspath(self.path(chat_id))
        return path

    # Index ----------------------------------------------------------------------

    async def open(self) -> None:
        await self._writer.call(self, self.load_index, urgent=True)

    def load_index(self) -> None:
        """Scan the directory once at start-up to build the chat summaries."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in self.directory.glob("*.json"):
            chat_id = path.stem
            if not valid_chat_id(chat_id):
                continue
            for record in self._read_file(path):
                self._index(chat_id, record)

    def _index(self, chat_id: str, record: Record) -> None:
        summarize(self._summaries, chat_id, record)

    def _view(self, chat_id: str) -> ChatSummary | None:
        """The chat's summary, with the records handed over and not yet written."""
        summary = self._summaries.get(chat_id)
        unwritten = self._unwritten.get(chat_id)
        if not unwritten:
            return summary
        view = {chat_id: replace(summary)} if summary is not None else {}
        for records in unwritten:
            for record in records:
                summarize(view, chat_id, record)
        return view[chat_id]

    def _views(self) -> list[ChatSummary]:
        if not self._unwritten:
            return list(self._summaries.values())
        views = [
            self._view(chat_id) if chat_id in self._unwritten else summary
            for chat_id, summary in self._summaries.items()
        ]
        views += [self._view(c) for c in self._unwritten if c not in self._summaries]
        return [view for view in views if view is not None]

    async def summary(self, chat_id: str) -> ChatSummary | None:
        return self._view(chat_id)

    async def page(
        self, limit: int, cursor: str = "", *, owner: Principal = ANONYMOUS, name_contains: str = ""
    ) -> tuple[list[ChatSummary], str]:
        return page_of(self._views(), limit, cursor, owner, name_contains)

    async def expired(self, before: int, limit: int) -> list[ChatSummary]:
        return expired_of(self._views(), before, limit)

    async def delete(self, chat_id: str) -> bool:
        """Remove the chat's file (and a torn line kept beside it) and forget the chat."""
        path = self.path(chat_id)

        def remove() -> bool:
            for kept in (self._checked, self._failed, self._dirty):
                kept.discard(chat_id)
            path.with_suffix(path.suffix + ".torn").unlink(missing_ok=True)
            try:
                path.unlink()
            except FileNotFoundError:
                return False
            return True

        try:  # after the appends handed over before
            existed = await self._queue(chat_id, remove, urgent=True)
        except OSError as error:
            raise StoreFailed(f"could not delete chat {chat_id!r}: {error}") from error
        known = self._summaries.pop(chat_id, None) is not None
        self._paths.pop(chat_id, None)
        return existed or known

    # Writing --------------------------------------------------------------------

    async def append(self, chat_id: str, records: list[Record]) -> None:
        path = self._written_path(chat_id)
        if chat_id in self._failed:
            raise StoreFailed(f"chat {chat_id!r} is read-only after a failed fsync")
        data = b"".join(encode_record(r) for r in records)
        if chat_id in self._checked and chat_id not in self._queued and self.fsync != "always":
            try:
                self._append(chat_id, path, data, create=False)  # StoreFailed: nothing kept
            except FileNotFoundError:  # removed behind the store's back: made again in the thread
                self._checked.discard(chat_id)
            else:
                for record in records:
                    self._index(chat_id, record)
                return
        # Listed at once (see `_view`); written in the writer's thread, after the appends
        # handed over before, with the other work of its batch. The summary follows the
        # write's outcome even when the caller stops waiting for it.
        # A new chat's first records: nobody waits for them before its run's sync (or a
        # read of the chat, which takes them along).
        lazy = chat_id not in self._summaries and self.fsync != "always"
        self._unwritten.setdefault(chat_id, []).append(records)
        written = self._queue(chat_id, self._write, chat_id, path, data, lazy=lazy)
        written.add_done_callback(lambda done: self._written(chat_id, records, done))
        try:
            await asyncio.shield(written)
        except OSError as error:  # opening the file, checking its tail
            raise StoreFailed(f"could not append to chat {chat_id!r}: {error}") from error

    def _queue(
        self,
        chat_id: str,
        func: Callable[..., T],
        *args: Any,
        urgent: bool = False,
        lazy: bool = False,
    ) -> asyncio.Future[T]:
        """`func(*args)` in the writer's thread, counted as work of the chat until done."""
        self._queued[chat_id] = self._queued.get(chat_id, 0) + 1
        future = self._writer.call(self, func, *args, urgent=urgent, lazy=lazy)
        future.add_done_callback(lambda _: self._dequeue(chat_id))
        return future

    def _dequeue(self, chat_id: str) -> None:
        left = self._queued[chat_id] - 1
        if left:
            self._queued[chat_id] = left
        else:
            del self._queued[chat_id]

    def _written(self, chat_id: str, records: list[Record], done: asyncio.Future[None]) -> None:
        """The append of `records` is over: in the summary if it was written, else out."""
        unwritten = self._unwritten.get(chat_id)
        if unwritten is not None:
            for index, handed in enumerate(unwritten):
                if handed is records:
                    del unwritten[index]
                    break
            if not unwritten:
                del self._unwritten[chat_id]
        if not done.cancelled() and done.exception() is None:
            for record in records:
                self._index(chat_id, record)

    def _write(self, chat_id: str, path: str, data: bytes) -> None:
        """In the writer's thread: append `data` to the chat's file, creating it (a new chat)
        or checking its tail first (the first append to a file that exists)."""
        if chat_id in self._failed:
            raise StoreFailed(f"chat {chat_id!r} is read-only after a failed fsync")
        if chat_id not in self._checked:
            if self._create(chat_id, path, data):
                return
            self.directory.mkdir(parents=True, exist_ok=True)
            repair_torn_tail(Path(path))
            self._checked.add(chat_id)
        self._append(chat_id, path, data)

    def _append(self, chat_id: str, path: str, data: bytes, *, create: bool = True) -> None:
        """Append `data` to the chat's file (created or checked before); never creates it
        unless `create` (in the writer's thread), else FileNotFoundError."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | (os.O_CREAT if create else 0), 0o640)
        except FileNotFoundError:
            if create:
                raise StoreFailed(f"could not append to chat {chat_id!r}: no directory") from None
            raise
        except OSError as error:
            raise StoreFailed(f"could not append to chat {chat_id!r}: {error}") from error
        try:
            self._append_all(chat_id, fd, data)
            if self.fsync == "always":
                self._fsync(chat_id, fd)
            else:
                self._dirty.add(chat_id)
        finally:
            os.close(fd)

    def _create(self, chat_id: str, path: str, data: bytes) -> bool:
        """Write a new chat's file with `data`; False when it exists (or its directory does
        not): `_write` then checks its tail (or makes the directory) first."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o640)
        except (FileExistsError, FileNotFoundError):
            return False
        try:
            self._append_all(chat_id, fd, data)
            if self.fsync == "always":
                self._fsync(chat_id, fd)
        except StoreFailed:
            Path(path).unlink(missing_ok=True)  # the file this call made: no chat, not none
            raise
        finally:
            os.close(fd)
        self._checked.add(chat_id)
        if self.fsync != "always":
            self._dirty.add(chat_id)
        return True

    def _append_all(self, chat_id: str, fd: int, data: bytes) -> None:
        """Write all of `data` at the end of the file, or cut the file back to where it
        ended and raise `StoreFailed`. A write may store part of its buffer and return the
        count (a full disk): the rest is written next, and an error then is the failure.
        One writer per file (the writer's thread): the append began at the size before it."""
        written = 0
        try:
            while written < len(data):
                count = os.write(fd, data[written:] if written else data)
                if count <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                written += count
        except OSError as error:
            why = f"wrote {written} of {len(data)} bytes: {error.strerror or error}"
            if written:
                try:
                    os.ftruncate(fd, os.fstat(fd).st_size - written)
                except OSError as cut_error:  # the next append checks the tail first
                    self._checked.discard(chat_id)
                    log.error("chat %s: could not cut a failed append off (%s)", chat_id, cut_error)
            raise StoreFailed(f"could not append to chat {chat_id!r}: {why}") from error

    def _fsync(self, chat_id: str, fd: int) -> None:
        try:
            os.fsync(fd)
        except OSError as error:
            self._failed.add(chat_id)
            log.error("fsync of chat %s failed (%s); the chat is now read-only", chat_id, error)
            raise StoreFailed(f"could not make chat {chat_id!r} durable: {error}") from error

    async def sync(self, chat_id: str) -> None:
        if self.fsync != "run" or (chat_id not in self._dirty and chat_id not in self._queued):
            return
        await self._queue(chat_id, self._sync, chat_id, self._written_path(chat_id))

    def _sync(self, chat_id: str, path: str) -> None:
        """In the writer's thread: fsync the chat's file if an append left it dirty."""
        if chat_id not in self._dirty:
            return
        self._dirty.discard(chat_id)
        fd = os.open(path, os.O_RDONLY)
        try:
            self._fsync(chat_id, fd)
        finally:
            os.close(fd)

    def hurry(self) -> None:
        """Write what was handed over now, without waiting for the rest of its batch."""
        self._writer.hurry()

    async def close(self) -> None:
        await self._writer.drain()

    # Reading --------------------------------------------------------------------

    async def read(self, chat_id: str) -> list[Record]:
        path = self.path(chat_id)

        def read() -> list[Record]:
            if not path.exists():
                raise ChatNotFound(f"no chat {chat_id!r}", chat_id=chat_id)
            return self._read_file(path)

        return await self._writer.call(self, read, urgent=True)  # after the appends before

    @staticmethod
    def _read_file(path: Path) -> list[Record]:
        records: list[Record] = []
        with path.open("rb") as file:
            for number, line in enumerate(file, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as error:
                    log.warning("%s:%d: skipping a corrupt line (%s)", path, number, error)
                    continue
                if not isinstance(record, dict) or record.get("_type") not in RECORD_TYPES:
                    log.warning("%s:%d: skipping a line that is not a chat record", path, number)
                    continue
                records.append(upgrade_record(record))
        return records


def encode_record(record: Record) -> bytes:
    """One record as one line of compact UTF-8 JSON (orjson; the standard library's json
    for what orjson refuses, such as non-string keys or integers beyond 64 bits)."""
    try:
        return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:
        return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def repair_torn_tail(path: Path) -> bool:
    """Cut off an incomplete last line (saved beside as `.torn`); True when one was found."""
    try:
        file = path.open("rb+")
    except FileNotFoundError:
        return False
    with file:
        size = file.seek(0, os.SEEK_END)
        if size == 0:
            return False
        file.seek(size - 1)
        if file.read(1) == b"\n":
            return False
        # walk back to the last complete line
        position, tail = size, b""
        while position > 0:
            step = min(65536, position)
            position -= step
            file.seek(position)
            tail = file.read(step) + tail
            cut = tail.rfind(b"\n")
            if cut >= 0:
                position += cut + 1
                tail = tail[cut + 1 :]
                break
        with path.with_suffix(path.suffix + ".torn").open("ab") as torn:
            torn.write(tail + b"\n")
        file.truncate(position)
        file.flush()
        os.fsync(file.fileno())
    log.warning("%s: cut off a torn last line of %d bytes (kept in .torn)", path, len(tail))
    return True
