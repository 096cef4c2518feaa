"""The state ports: what the core needs to keep and find, whatever keeps it.

- `ChatStore`: the durable, append-only records of each chat (SPEC §6).
- `RunLog`: the complete event logs of ended runs, for re-attaching later.
- `RunBus`: the live runs — where their events are followed from, and where a
  Submit or a Cancel for a run is delivered to the run that waits for it.
- `UploadStore`: uploaded files, their description and their bytes.
- `RunJournal`: what a run started with, its events and its steps' results, while it
  runs, so that another process can resume it.
- `QuotaCounters`: the counters quotas are kept in, shared by replicas (Redis) or not.
- `SpendLedger`: what the model calls used, per tenant, API key, agent, model and day.

Every method that may touch I/O is async. Implementations live in
`service/state/` (in-process and file-backed ones today); a new backend is a
new module there plus one line in its registration table.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from service.core.commands import SubmitCommand, SubmitResult
from service.core.events import Event
from service.core.ids import ANONYMOUS, Principal
from service.core.run.journal import JournaledRun, JournalEntry
from service.core.run.state import RunState
from service.core.run.waits import Waits
from service.core.values import (
    ChatSummary,
    LiveRun,
    Record,
    RunRef,
    SpendEntry,
    StoredUpload,
)


class ChatStore(Protocol):
    """Durable, append-only chat records. Chat ids reaching it are already checked."""

    async def open(self) -> None:
        """Prepare the store (create its place, load its index) before the first call."""
        ...

    async def append(self, chat_id: str, records: list[Record]) -> None:
        """Append `records` to the chat (creating it), atomically per record."""
        ...

    async def read(self, chat_id: str) -> list[Record]:
        """Every readable record of the chat, in order; raises ChatNotFound."""
        ...

    async def summary(self, chat_id: str) -> ChatSummary | None:
        """The chat's summary, or None when the chat does not exist."""
        ...

    async def page(
        self, limit: int, cursor: str = "", *, owner: Principal = ANONYMOUS, name_contains: str = ""
    ) -> tuple[list[ChatSummary], str]:
        """`owner`'s chats newest first, `limit` at a time; the page and the next cursor.
        With `name_contains`, only the chats whose name contains it (ignoring case)."""
        ...

    async def expired(self, before: int, limit: int) -> list[ChatSummary]:
        """At most `limit` chats of any owner last changed before `before` (ms since the
        epoch), oldest first."""
        ...

    async def delete(self, chat_id: str) -> bool:
        """Remove the chat and its records; False when there was no such chat."""
        ...

    async def sync(self, chat_id: str) -> None:
        """Make the chat's appended records durable, per the store's policy."""
        ...

    async def close(self) -> None:
        """Release what the store holds (connections); no call follows."""
        ...


class RunLog(Protocol):
    """The event logs of ended runs, kept for a while after the run left memory."""

    async def open(self) -> None:
        """Prepare the log (create its place, prune what expired)."""
        ...

    async def save(self, run_id: str, events: Sequence[Event]) -> None:
        """Keep the complete log of an ended run."""
        ...

    async def load(self, run_id: str) -> list[Event] | None:
        """The run's events, or None when the run was never kept (or expired)."""
        ...

    async def delete(self, run_ids: Sequence[str]) -> int:
        """Forget the logs of these runs (a chat deleted); how many were kept."""
        ...

    async def close(self) -> None:
        """Release what the log holds (connections); no call follows."""
        ...


class RunBus(Protocol):
    """The live runs of the service, and the messages addressed to them.

    The run's owner (the process executing it) registers it when it starts,
    which makes it the active run of its chat; marks it `ended` when its
    terminal event is out (the chat is free again) and `settled` once the run's
    chat records are durable (another run of the chat may read them); and
    releases it once it is no longer kept for re-attaching. Anyone may find a
    run, follow its events, cancel it, or answer the tools it waits on; the
    owner's tools wait in its `waits`. An in-process bus knows only its own
    runs; a distributed one lets any replica do all of this for any run.
    """

    @property
    def waits(self) -> Waits:
        """The waits of this process's runs: where its runs' tools wait, and where the
        Submits the bus receives for them are delivered."""
        ...

    async def open(self) -> None:
        """Connect, before the first run."""
        ...

    async def close(self) -> None:
        """Disconnect, after the last run."""
        ...

    async def register(self, run: RunState, *, new_chat: bool = False) -> RunRef | None:
        """Make `run` live and the active run of its chat; None when done.

        When the chat already has an active run, nothing is registered and that
        run is returned instead. `new_chat`: the chat has no records yet, so no run
        can be active on it that the bus lost track of (a distributed bus that lost
        its data waits for owners to re-assert their runs before claiming a chat
        that has records).
        """
        ...

    def on_lost(self, resume: Callable[[str, str], Awaitable[RunState | None]]) -> None:
        """Have `resume` go on with a run whose owner this replica finds lost, or which a
        draining replica handed over: `resume(run_id, reason)`, reason `owner_lost` or
        `drain` (a journaled run resumes; it is ended OWNER_LOST when `resume` gives None).
        A bus that knows only this process's runs never finds an owner lost."""
        ...

    async def drain(self) -> None:
        """This process is stopping: from now on it takes over no run of another replica
        (and other replicas know it)."""
        ...

    async def can_hand_over(self) -> bool:
        """Whether a run this process hands over (`hand_over`) can go on at once elsewhere:
        another replica is up and not draining. A bus that knows only this process's runs
        never can (they resume once a process starts again on the journal)."""
        ...

    async def hand_over(self, run: RunState) -> None:
        """`run` stopped here without an end, its journal complete (a drain): let another
        replica take it over at once, without waiting for this one's lease to expire. The
        bus forgets it here."""
        ...

    async def adopt(self, run: RunState) -> bool:
        """Make `run` live here again, under its id, as `resume` (see `on_lost`) goes on
        with it; False when another replica took it over meanwhile. A bus that knows only
        this process's runs registers it (the runs its last process left)."""
        ...

    async def ended(self, run: RunState) -> None:
        """The run's terminal event is out; its chat is free. It can still be followed."""
        ...

    async def settled(self, run: RunState) -> None:
        """The run's chat records are durable."""
        ...

    async def release(self, run_id: str) -> None:
        """Forget the run and its waits."""
        ...

    def local(self, run_id: str) -> RunState | None:
        """The run, when it is live (or recently ended) in this process."""
        ...

    def local_runs(self) -> Mapping[str, RunState]:
        """The runs live (or recently ended) in this process, by id."""
        ...

    async def find(self, run_id: str) -> RunRef | None:
        """The run, live or recently ended, wherever it runs; None when unknown."""
        ...

    async def active_of(self, chat_id: str) -> RunRef | None:
        """The chat's active run, if any."""
        ...

    async def wait_ended(self, run_id: str) -> None:
        """Return once the run has ended (at once when it is unknown)."""
        ...

    async def wait_settled(self, chat_id: str) -> None:
        """Return once the chat's last ended run has settled (its records are durable)."""
        ...

    async def follow(self, run_id: str, after_seq: int) -> AsyncGenerator[Event, None] | None:
        """The run's events after `after_seq`, then live ones; None when it is not known."""
        ...

    async def cancel(self, run_id: str, reason: str) -> bool | None:
        """Ask the run to stop: True when asked, False when it had ended, None: unknown."""
        ...

    async def submit(self, command: SubmitCommand) -> SubmitResult:
        """Deliver a user's answer to the tool a run waits on (a run of another
        principal than the command's is an unknown run)."""
        ...

    async def live_of(self, chat_id: str) -> LiveRun | None:
        """The chat's run in progress (not yet ended), with its last seq and open waits."""
        ...

    async def forget_chat(self, chat_id: str, run_ids: Sequence[str]) -> None:
        """Forget what the bus keeps of a deleted chat: its ended runs `run_ids` (their
        events, state and waits) and the chat's own marks. None of its runs is running."""
        ...


class RunJournal(Protocol):
    """Where runs' journals are kept while they run (service/core/run/journal.py), so that a
    run outlives its process: SQLite, PostgreSQL, or in process (service/state/)."""

    async def open(self) -> None:
        """Prepare the journal before the first run."""
        ...

    async def write(self, entries: Sequence[JournalEntry]) -> None:
        """Write `entries` durably, in order, as one batch."""
        ...

    def write_now(self, entries: Sequence[JournalEntry]) -> bool:
        """Write `entries` as `write` does, at once on the event loop, if that takes no
        waiting (no network, no lock held elsewhere, no fsync); False, having written
        nothing, when it would (then `write` is called)."""
        ...

    async def unfinished(self) -> list[str]:
        """The ids of the runs begun and not ended, oldest first."""
        ...

    async def load(self, run_id: str) -> JournaledRun | None:
        """The run's journal, or None when it has none (it ended, or never began)."""
        ...

    async def close(self) -> None:
        """Release what the journal holds; no call follows."""
        ...


class UploadStore(Protocol):
    """Uploaded files: each one's description and bytes, by id, written once.

    Ids and limits are checked before a call reaches the store (`core.uploads.Uploads`),
    and so is the owner: the store returns an upload whoever asks.
    """

    async def open(self) -> None:
        """Prepare the store (create its place, connect) before the first call."""
        ...

    async def put(self, upload: StoredUpload, content: bytes) -> None:
        """Keep a new upload and its content; both are readable once this returns."""
        ...

    async def get(self, upload_id: str) -> tuple[StoredUpload, bytes] | None:
        """The upload and its content, or None when there is none with that id."""
        ...

    async def delete_chat(self, chat_id: str) -> int:
        """Remove the uploads made to chat `chat_id` (their description and content); how
        many there were."""
        ...

    async def close(self) -> None:
        """Release what the store holds (connections); no call follows."""
        ...


class QuotaCounters(Protocol):
    """The counters of the quotas (service/core/quotas.py): in process, or in Redis shared by
    every replica. Keys are the quota's own; each counter or set expires after `ttl_s`."""

    async def open(self) -> None:
        """Connect, before the first call."""
        ...

    async def close(self) -> None:
        """Disconnect, after the last call."""
        ...

    async def add(self, key: str, amount: int, ttl_s: float) -> int:
        """Add `amount` to the counter `key` (made at 0, expiring `ttl_s` after it was
        made); its value now."""
        ...

    async def value(self, key: str) -> int:
        """The counter `key` (0 when there is none)."""
        ...

    async def take(self, key: str, member: str, limit: int, ttl_s: float) -> bool:
        """Add `member` to the set `key` if it holds fewer than `limit` live members (each
        lives `ttl_s` unless renewed); whether it was added."""
        ...

    async def renew(self, key: str, member: str, ttl_s: float) -> None:
        """Let `member` of the set `key` live `ttl_s` more."""
        ...

    async def give_back(self, key: str, member: str) -> None:
        """Remove `member` from the set `key`."""
        ...


class SpendLedger(Protocol):
    """What the model calls used, by UTC day, tenant, API key, agent and model."""

    async def open(self) -> None:
        """Prepare the ledger before the first call."""
        ...

    async def add(self, entries: Sequence[SpendEntry]) -> None:
        """Add each entry's amounts to its row (made at 0)."""
        ...

    async def read(self, tenant: str | None, first_day: str, last_day: str) -> list[SpendEntry]:
        """The rows of `tenant` (None: every tenant) from `first_day` to `last_day`
        ("YYYY-MM-DD", both included), by day, tenant, key, agent and model."""
        ...

    async def close(self) -> None:
        """Release what the ledger holds; no call follows."""
        ...
