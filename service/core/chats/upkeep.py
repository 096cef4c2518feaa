"""A chat's life after its runs: renamed, deleted with everything of it, expired.

- **Rename**: a `update` record joins the chat's records (its summary takes the new
  name, `GetChat` replays it as a `chat.update` event where it happened).
- **Delete**: everything the service keeps of a chat goes — the uploads made to it, the
  event logs of its runs, their journal entries, what the run bus keeps of them, what
  other parts keep per chat (`cleaners`: the `_bash_` workspace), and last its records,
  so that a delete that fails half-way leaves the chat listed, to be deleted again. A
  chat with a run in progress is refused (`ChatBusy`) unless the caller asks to cancel
  the run first; the run then ends (`run.cancel`, reason "chat_deleted"), its records
  are written and its log kept before all of it is deleted.
- **Expire**: chats not changed for a time-to-live are deleted the same way, by a sweep
  (whoever owns them; a chat whose run is in progress is left for the next sweep).

Only the owner of a chat renames or deletes it: to anyone else it does not exist. A
query continuing the chat while it is being deleted may start the chat afresh (its
records then hold that query alone).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from service.core import events
from service.core.chats.history import update_record
from service.core.errors import ChatBusy, ChatNotFound, InvalidRequest
from service.core.ids import Principal, shorten
from service.core.ports import ChatStore, RunBus, RunJournal, RunLog, UploadStore
from service.core.run.journal import JournalEntry
from service.core.values import ChatSummary

log = logging.getLogger("agw.chats")

#: The longest name a chat may be given.
MAX_CHAT_NAME = 200
#: The cancel reason of a run stopped because its chat is deleted.
CHAT_DELETED = "chat_deleted"
#: How many expired chats a sweep reads at a time.
SWEEP_BATCH = 100

#: What else keeps something per chat and forgets it when the chat is deleted.
ChatCleaner = Callable[[str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Deleted:
    """What a delete removed."""

    chat_id: str
    cancelled_run_id: str  # the run in progress cancelled first, if any
    runs: int
    uploads: int


@dataclass(eq=False)
class ChatUpkeep:
    """Renames, deletes and expires chats, across every state port that keeps a part."""

    chats: ChatStore
    run_log: RunLog
    bus: RunBus
    uploads: UploadStore
    journal: RunJournal | None
    flush: Callable[[], Awaitable[None]]  # until this process's ended runs are kept
    cleaners: Sequence[ChatCleaner] = ()

    async def _owned(self, chat_id: str, principal: Principal) -> ChatSummary:
        summary = await self.chats.summary(chat_id)
        if summary is None or summary.owner != principal:
            raise ChatNotFound(f"no chat {chat_id!r}", chat_id=chat_id)
        return summary

    async def rename(
        self, chat_id: str, chat_name: str, principal: Principal, request_id: str = ""
    ) -> tuple[ChatSummary, events.Event]:
        """Give the chat a new name; its summary now and the `chat.update` recorded."""
        name = " ".join(chat_name.split())
        if not name:
            raise InvalidRequest("chatName is required (and not only blanks)")
        if len(name) > MAX_CHAT_NAME:
            raise InvalidRequest(
                f"chatName is {len(name)} characters; at most {MAX_CHAT_NAME} are allowed"
            )
        summary = await self._owned(chat_id, principal)
        previous = summary.chat_name  # (a store's summary may change with the append)
        request_id = request_id or str(uuid.uuid4())
        now = time.time_ns() // 1_000_000
        record = update_record(chat_id, now, name, previous, request_id)
        await self.chats.append(chat_id, [record])
        event = events.chat_update(name, request_id=request_id, previous_chat_name=previous)
        event.seq, event.type, event.timestamp, event.chat_id = 1, "chat.update", now, chat_id
        renamed = await self.chats.summary(chat_id)
        return renamed if renamed is not None else summary, event

    async def delete(
        self, chat_id: str, principal: Principal | None, *, cancel_active_run: bool = False
    ) -> Deleted:
        """Delete the chat and everything of it (`principal` None: whoever owns it)."""
        summary = await self.chats.summary(chat_id)
        active = await self.bus.active_of(chat_id)
        owner = summary.owner if summary else active.owner if active else None
        if owner is None or (principal is not None and owner != principal):
            raise ChatNotFound(f"no chat {chat_id!r}", chat_id=chat_id)
        cancelled = ""
        if active is not None:
            if not cancel_active_run:
                raise ChatBusy(
                    f"chat {chat_id!r} has a run in progress ({active.run_id!r}): cancel it "
                    "first, or delete the chat with cancelActiveRun",
                    chat_id=chat_id,
                    run_id=active.run_id,
                )
            await self.bus.cancel(active.run_id, CHAT_DELETED)
            await self.bus.wait_ended(active.run_id)
            cancelled = active.run_id
        await self.bus.wait_settled(chat_id)  # its records are written, wherever it ran
        await self.flush()  # and, here, its log is kept: then it is deleted with the rest
        try:
            records = await self.chats.read(chat_id)
        except ChatNotFound:
            records = []
        run_ids = list(dict.fromkeys(str(r["runId"]) for r in records if r.get("runId")))
        if cancelled and cancelled not in run_ids:
            run_ids.append(cancelled)
        uploads = await self.uploads.delete_chat(chat_id)
        await self.run_log.delete(run_ids)
        if self.journal is not None and run_ids:
            await self.journal.write([JournalEntry(run_id, "end") for run_id in run_ids])
        await self.bus.forget_chat(chat_id, run_ids)
        for clean in self.cleaners:
            await clean(chat_id)
        await self.chats.delete(chat_id)
        log.info(
            "chat %s deleted: %d runs, %d uploads%s",
            chat_id,
            len(run_ids),
            uploads,
            f", run {cancelled} cancelled first" if cancelled else "",
        )
        return Deleted(chat_id, cancelled, len(run_ids), uploads)

    async def expire(self, ttl_s: float) -> list[str]:
        """Delete the chats not changed for `ttl_s`; the ids deleted. A chat with a run in
        progress is kept (for the next sweep); a chat that fails to delete is logged."""
        before = time.time_ns() // 1_000_000 - round(ttl_s * 1000)
        deleted: list[str] = []
        skipped: set[str] = set()
        while True:
            batch = await self.chats.expired(before, SWEEP_BATCH + len(skipped))
            fresh = [s for s in batch if s.chat_id not in skipped]
            if not fresh:  # each round deletes or skips what it found: this ends
                break
            for summary in fresh:
                try:
                    await self.delete(summary.chat_id, None)
                except ChatBusy:
                    skipped.add(summary.chat_id)
                except ChatNotFound:
                    pass  # deleted meanwhile (another replica's sweep)
                except Exception:
                    log.exception("could not delete expired chat %s", shorten(summary.chat_id))
                    skipped.add(summary.chat_id)
                else:
                    deleted.append(summary.chat_id)
        if deleted:
            log.info("deleted %d chats unchanged for %.0f s", len(deleted), ttl_s)
        return deleted
