"""The in-process `ChatStore`, `RunLog` and `UploadStore`: nothing survives the process.

For tests, for trying the service out, and for a replica whose history lives
elsewhere. Records are kept as given (a copy), so reading them back returns
exactly what was appended.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Sequence

from agw.v1 import events_pb2 as pb

from service.core.errors import ChatNotFound
from service.core.events import Event
from service.core.ids import ANONYMOUS, Principal
from service.core.run.journal import JournaledRun, JournalEntry
from service.core.values import ChatSummary, Record, StoredUpload
from service.state.summaries import expired_of, page_of, summarize


class LocalChatStore:
    """Chats in a dict."""

    def __init__(self) -> None:
        self._records: dict[str, list[Record]] = {}
        self._summaries: dict[str, ChatSummary] = {}

    async def open(self) -> None:
        return None

    async def append(self, chat_id: str, records: list[Record]) -> None:
        kept = self._records.setdefault(chat_id, [])
        for record in records:
            kept.append(copy.deepcopy(record))
            summarize(self._summaries, chat_id, record)

    async def read(self, chat_id: str) -> list[Record]:
        records = self._records.get(chat_id)
        if records is None:
            raise ChatNotFound(f"no chat {chat_id!r}", chat_id=chat_id)
        return copy.deepcopy(records)

    async def summary(self, chat_id: str) -> ChatSummary | None:
        return self._summaries.get(chat_id)

    async def page(
        self, limit: int, cursor: str = "", *, owner: Principal = ANONYMOUS, name_contains: str = ""
    ) -> tuple[list[ChatSummary], str]:
        return page_of(self._summaries.values(), limit, cursor, owner, name_contains)

    async def expired(self, before: int, limit: int) -> list[ChatSummary]:
        return expired_of(self._summaries.values(), before, limit)

    async def delete(self, chat_id: str) -> bool:
        self._summaries.pop(chat_id, None)
        return self._records.pop(chat_id, None) is not None

    async def sync(self, chat_id: str) -> None:
        return None

    async def close(self) -> None:
        return None


class LocalRunLog:
    """Logs of ended runs in a dict, dropped after `ttl_s`."""

    def __init__(self, ttl_s: float = 86400.0) -> None:
        self.ttl_s = ttl_s
        self._logs: dict[str, tuple[float, list[Event]]] = {}

    async def open(self) -> None:
        return None

    async def save(self, run_id: str, events: Sequence[Event]) -> None:
        now = time.monotonic()
        self._logs = {k: v for k, v in self._logs.items() if now - v[0] < self.ttl_s}
        self._logs[run_id] = (now, list(events))

    async def load(self, run_id: str) -> list[Event] | None:
        kept = self._logs.get(run_id)
        if kept is None or time.monotonic() - kept[0] >= self.ttl_s:
            return None
        return list(kept[1])

    async def delete(self, run_ids: Sequence[str]) -> int:
        return sum(self._logs.pop(run_id, None) is not None for run_id in run_ids)

    async def close(self) -> None:
        return None


class LocalUploadStore:
    """Uploads in a dict."""

    def __init__(self) -> None:
        self._uploads: dict[str, tuple[StoredUpload, bytes]] = {}

    async def open(self) -> None:
        return None

    async def put(self, upload: StoredUpload, content: bytes) -> None:
        self._uploads[upload.id] = (upload, bytes(content))

    async def get(self, upload_id: str) -> tuple[StoredUpload, bytes] | None:
        return self._uploads.get(upload_id)

    async def delete_chat(self, chat_id: str) -> int:
        ids = [i for i, (upload, _) in self._uploads.items() if upload.chat_id == chat_id]
        for upload_id in ids:
            del self._uploads[upload_id]
        return len(ids)

    async def close(self) -> None:
        return None


class LocalRunJournal:
    """The journals of the runs in flight, in memory: they outlive a run's task, not the
    process (enough for a front door that resumes another's runs in the same process)."""

    def __init__(self) -> None:
        self._runs: dict[str, JournaledRun] = {}

    async def open(self) -> None:
        return None

    async def write(self, entries: Sequence[JournalEntry]) -> None:
        self.write_now(entries)

    def write_now(self, entries: Sequence[JournalEntry]) -> bool:
        for entry in entries:
            if entry.kind == "begin":
                record = json.loads(entry.data)
                self._runs[entry.run_id] = JournaledRun(entry.run_id, entry.key, record)
                continue
            run = self._runs.get(entry.run_id)
            if run is None or entry.attempt < run.attempts:  # of an owner it was taken from
                continue
            if entry.kind == "event":
                run.events.append(pb.Event.FromString(entry.data))
            elif entry.kind == "start":
                if entry.key not in run.steps:
                    run.started.add(entry.key)
            elif entry.kind == "step":
                run.started.discard(entry.key)
                run.steps[entry.key] = json.loads(entry.data)
            elif entry.kind == "resume":
                run.attempts = max(run.attempts, int(entry.key))
            elif entry.kind == "end":
                del self._runs[entry.run_id]
        return True

    async def unfinished(self) -> list[str]:
        return list(self._runs)

    async def load(self, run_id: str) -> JournaledRun | None:
        run = self._runs.get(run_id)
        if run is None:
            return None
        return JournaledRun(
            run.run_id,
            run.chat_id,
            dict(run.record),
            dict(run.steps),
            set(run.started),
            list(run.events),
            run.attempts,
        )

    async def close(self) -> None:
        return None
