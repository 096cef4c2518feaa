"""A run's event log: the envelope of every event, its open blocks, and its readers.

The log *is* the channel. Whatever produces a run's events appends them here;
each reader follows the log from its own position and waits when it has caught
up. A reader therefore never stalls the run, never holds a queue of its own, and
re-joining from any `seq` is a read of the log from that index — no gap, no
duplicate.

`EventLog.emit` guarantees the stream's invariants: seq counts from 1 without
holes, every `*.start` still open when the run ends gets its `*.end`, and
exactly one terminal event is appended, after which the log is closed.

Producers write through an `Emitter` (`log.scope(task_id=...)`): a scoped
emitter stamps its task id on what it emits, so several plan tasks can stream
into one log at once, each event carrying its own `taskId`. A nested run (a
subagent called as a tool) writes through `emitter.nested(tool_id)`: its events
carry the calling tool's id as `parentToolId`, in the run's one sequence, and
`close_nested` closes whatever blocks it left open when it ends. Observers (the chat
recorder, metrics) subscribe with `observe` and see every appended event, in
order, synchronously — like any reader, but without a position to keep.

A journaled run (service/core/run/journal.py) hands each event to its journal as it
is appended, and its readers see it once it is durable (`publish`): the log's
visible mark follows the journal. A resumed run's log starts with the events its
journal kept, and while the run's mode runs again (`replay`) an event the log
already holds is not appended twice.

A new run's opening is held (`hold`, `release`): its first events, their journal
entries and its readers wait until the run's first model request is out (anything the
run emits before that comes after its first events). A turn's first output is handed
on (`hand_on`): its producer lets the readers write it out before going on with the
rest of what it read.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from time import time_ns
from typing import Any, TypeVar, overload

from service.core import events
from service.core.errors import RunHandedOver
from service.core.events import BLOCK_ENDS, BLOCKS, EVENT_TYPES, TERMINALS, Event
from service.core.middleware import hooks
from service.core.run.journal import (
    JournalEntry,
    Journaling,
    Lane,
    Readable,
    Replay,
    RunSteps,
    lane_path,
)
from service.core.signals import Flag

Observer = Callable[[Event], None]
#: The longest `hand_on` waits for the readers to write out what was emitted.
HAND_ON_S = 0.005
T = TypeVar("T")

#: oneof field → (opens a block, the payload's block id field), for the blocks' starts and ends.
_BLOCK_ROLES: dict[str, tuple[bool, str]] = {
    **{start: (True, id_field) for start, (_, id_field) in BLOCKS.items()},
    **{end: (False, id_field) for end, id_field in BLOCK_ENDS.items()},
}


class EventLog(Sequence[Event]):
    """The ordered, append-only events of one run."""

    __slots__ = (
        "_all_published",
        "_done",
        "_dropped",
        "_events",
        "_finished",
        "_handing",
        "_observers",
        "_on_event",
        "_open",
        "_opening",
        "_packed",
        "_published",
        "_raw",
        "_visible",
        "_waiters",
        "chat_id",
        "handed_over",
        "journaling",
        "on_unwatched",
        "replay",
        "run_id",
        "steps",
        "subject",
        "subscribers",
    )

    def __init__(
        self,
        run_id: str,
        chat_id: str,
        middlewares: Sequence[object] = (),
        *,
        subject: Any = None,
        journaling: Journaling | None = None,
        journaled: Sequence[Event] = (),
    ) -> None:
        self.run_id = run_id
        self.chat_id = chat_id
        # What the middlewares' `on_event(run, event)` receive as `run` (the run's state).
        self.subject = subject
        self.subscribers = 0  # readers following the log right now
        self.on_unwatched: Callable[[EventLog], None] | None = None  # last reader left
        # The events, or the bytes the journal wrote of those every reader has read
        # (`_pack`): a parsed event holds 0.5–1 KiB, its bytes a tenth of that. Read
        # through `_parsed`, which parses bytes again (for a late reader).
        self._events: list[Event | bytes] = list(journaled)
        self._packed = 0  # the events before this index may be held as bytes
        self._observers: list[Observer] = []
        self._on_event = hooks(middlewares, "on_event")
        # Ids of blocks whose start a middleware dropped (made at the first).
        self._dropped: dict[str, None] | None = None
        # Block id -> the index of its start event in the log, in opening order: the index,
        # not the event, so that a start held as its bytes (`_pack`) is not kept parsed too.
        self._open: dict[str, int] = {}
        for index, event in enumerate(journaled):
            self._track(event, event.WhichOneof("payload") or "", index)
        self._opening: list[Event] | None = None  # held: the first events, to emit first
        self._waiters: list[asyncio.Future[None]] = []
        self._handing: asyncio.Future[None] | None = None  # `hand_on` waits for the readers
        self._finished = Flag()
        self._done = False  # the terminal event is appended (what `_finished` tells waiters)
        # Journaled: each event goes to the journal, and readers see the durable ones only.
        self.journaling = journaling
        self._visible: int | None = len(self._events) if journaling is not None else None
        self._published: list[Observer] | None = None  # told of each event once visible
        self._all_published = Flag()  # the terminal event is visible
        self.replay: Replay | None = None  # while a resumed run's mode runs again
        self.handed_over = False  # its process stopped it without an end: it goes on elsewhere
        self.steps: RunSteps | None = None  # a journaled run's steps
        # The bytes the journal wrote of each event, kept for the run log (`serialized`)
        # so that no event is serialised twice; None once one is missing or they are taken.
        self._raw: list[bytes] | None = [] if journaling is not None and not journaled else None

    # -- the sequence ------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._events)

    @overload
    def __getitem__(self, index: int) -> Event: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Event]: ...

    def __getitem__(self, index: int | slice) -> Event | Sequence[Event]:
        if isinstance(index, slice):
            return [_parsed(entry) for entry in self._events[index]]
        return _parsed(self._events[index])

    def __iter__(self) -> Iterator[Event]:
        return map(_parsed, self._events)

    @property
    def done(self) -> bool:
        """Whether the terminal event has been appended."""
        return self._done

    @property
    def terminal(self) -> Event | None:
        return _parsed(self._events[-1]) if self.done else None

    # -- writing -----------------------------------------------------------------------

    def scope(self, task_id: str = "") -> Emitter:
        """An emitter whose events carry `task_id` (none: the run's own events)."""
        return Emitter(self, task_id)

    def observe(self, observer: Observer) -> None:
        """Call `observer` with every event appended from now on."""
        self._observers.append(observer)

    def observe_published(self, observer: Observer) -> None:
        """Call `observer` with every event as readers get to see it: at once, or once it
        is durable when the run is journaled (what other replicas are sent)."""
        if self.journaling is None:  # (also while held: `hold`)
            self._observers.append(observer)
        else:
            if self._published is None:
                self._published = []
            self._published.append(observer)

    def emit(self, event: Event) -> Event:
        """Stamp the envelope on `event`, append it and wake the readers.

        On the per-delta path: the payload's field is looked up once, and each
        table is consulted once.
        """
        if self._opening is not None:  # a held log's first events come first (`hold`)
            self._emit_opening()
        if self._done:
            raise RuntimeError(f"run {self.run_id} already ended; cannot emit {event}")
        field: str | None = event.WhichOneof("payload")
        if field is None:
            raise ValueError("event without payload")
        event.type = EVENT_TYPES[field]
        event.timestamp = time_ns() // 1_000_000
        event.chat_id = self.chat_id
        event.run_id = self.run_id
        if self._on_event:
            kept = self._apply_middlewares(event, field)
            if kept is None:
                return event
            event, field = kept
        if self.replay is not None and self.replay.holds(event, field):
            return event  # the run resumed: its log has this event already
        log = self._events
        event.seq = len(log) + 1
        self._track(event, field, len(log))
        log.append(event)
        for observer in self._observers:
            observer(event)
        if field in TERMINALS:
            self._done = True
            self._finished.set()
            self._let_go()
        if self.journaling is not None:
            attempt = self.steps.attempt if self.steps is not None else 0
            raw = event.SerializeToString()
            if self._raw is not None:
                self._raw.append(raw)
            entry = JournalEntry(self.run_id, "event", str(event.seq), raw, attempt)
            self.journaling.submit(entry, self, event.seq)
        elif self._waiters:
            self._wake()
        return event

    def _track(self, event: Event, field: str, index: int) -> None:
        """Keep the open blocks current with `event`, the log's entry at `index`."""
        role = _BLOCK_ROLES.get(field)
        if role is not None:
            opens, id_field = role
            block_id = getattr(getattr(event, field), id_field)
            if opens:
                self._open[block_id] = index
            else:
                self._open.pop(block_id, None)

    def keep(self, event: Event) -> None:
        """Append `event` as it was (seq and time), without telling anyone: to rebuild, one
        event after the other, what a resumed run's recorder saw."""
        self._track(event, event.WhichOneof("payload") or "", len(self._events))
        self._events.append(event)
        self._raw = None

    def serialized(self) -> list[bytes] | None:
        """Each event's bytes as the journal wrote them, once, or None (not journaled, or
        taken already): the run log keeps these rather than serialising the events again.

        Taken at the run's end, they become what the log holds for as long as the run is
        kept: every event but the terminal one is held as its bytes from then on (`_pack`).
        """
        raw, self._raw = self._raw, None
        if raw is None or not self._done or len(raw) != len(self._events):
            return None
        self._pack(raw, len(raw) - 1)
        return raw

    def _pack(self, raw: list[bytes], upto: int) -> None:
        """Hold the events before `upto` as their bytes (`raw`, index for index): those every
        reader has read, of a run whose journal wrote them. A reader reading one again (a
        late one, a replay) parses it again; its observers had it when it was appended."""
        log = self._events
        upto = min(upto, len(raw), len(log))
        for index in range(self._packed, upto):
            log[index] = raw[index]
        self._packed = max(self._packed, upto)

    def hold(self, opening: Sequence[Event] = ()) -> None:
        """Show the readers nothing more and give the journal nothing until `release`;
        emit `opening` then, or as soon as anything else is emitted (before it).

        What is emitted meanwhile is appended and observed as usual; its journal entries
        (and those of the run's steps) are kept, in order, for `release`. A new run's
        opening is held so while its task sends its first model request: its first
        events, the journal's write and the readers' writes of them come after the
        request, not in its way (service/core/lifecycle.py).
        """
        self._opening = list(opening) or None
        journaling = self.journaling
        if journaling is None:
            self._visible = len(self._events)
        elif not isinstance(journaling, _Held):
            held = _Held(journaling)
            self.journaling = held
            if self.steps is not None:
                self.steps.journaling = held

    def release(self) -> None:
        """End `hold`: the opening is emitted (if it was not yet), the journal is given what
        was kept (readers see it once it is durable); an unjournaled run's readers see
        everything at once."""
        if self._opening is not None:
            self._emit_opening()
        held = self.journaling
        if held is None:
            if self._visible is not None:
                self._visible = None
                self._all_published.set()  # `published`: nothing more to wait for
                if self._waiters:
                    self._wake()
            return
        if not isinstance(held, _Held):
            return
        journaling = self.journaling = held.journaling
        if self.steps is not None and self.steps.journaling is held:
            self.steps.journaling = journaling
        for entry, log, seq in held.entries:
            journaling.submit(entry, log, seq)

    def _emit_opening(self) -> None:
        opening, self._opening = self._opening or [], None
        for event in opening:
            self.emit(event)

    async def hand_on(self) -> None:
        """Let the readers write out the events emitted so far before the caller goes on.

        For a producer with more to do before it next waits (the rest of an upstream
        chunk, the end of its turn, the run's end), whose work would hold the loop while
        the readers' writes wait for it: a turn's first output reaches its client first.
        Returns once the events are shown (journaled) and every reader waits for more, or
        after `HAND_ON_S` (a slow reader, a slow journal, do not hold the run longer); at
        once without a reader.
        """
        if not self.subscribers:
            return
        if self.journaling is not None and self.visible < len(self._events):
            self.journaling.now()  # shown now, not a loop turn later
        if self._handed_on():
            return
        handing = self._handing = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(HAND_ON_S):
                await handing
        except TimeoutError:
            pass
        finally:
            if self._handing is handing:
                self._handing = None

    def _handed_on(self) -> bool:
        """Whether every event is shown and every reader has read it, and waits for more."""
        return len(self._waiters) >= self.subscribers and self.visible >= len(self._events)

    def _handed(self) -> None:
        """Tell `hand_on` once it is handed on (a reader waits again, or left)."""
        handing = self._handing
        if handing is not None and self._handed_on():
            self._handing = None
            if not handing.done():
                handing.set_result(None)

    def publish(self, seq: int) -> None:
        """The events up to `seq` are durable: show them to the readers."""
        if self._visible is not None and seq > self._visible:
            published = self._published
            if published:
                for event in self[self._visible : seq]:
                    for observer in published:
                        observer(event)
            self._visible = seq
            if self._done and seq == len(self._events):
                self._published = None  # the terminal is out: let go of them too
                self._all_published.set()
            if self._waiters:
                self._wake()

    async def published(self) -> None:
        """Wait until the terminal event is out and readers see every event (durable, when
        the run is journaled)."""
        await self._finished.wait()
        if self._visible is not None:
            await self._all_published.wait()

    @property
    def visible(self) -> int:
        """How many of the events readers may see (all of them, unless journaled)."""
        return len(self._events) if self._visible is None else self._visible

    @property
    def open_blocks(self) -> list[Event]:
        """The start events of the blocks open now, in opening order."""
        log = self._events
        return [_parsed(log[index]) for index in self._open.values()]

    def _let_go(self) -> None:
        """Once the terminal event is out, nothing more is emitted: drop what refers back to
        the run (its observers, the last reader's hook, the middlewares' subject), so that an
        ended run is freed by reference counting, not by a rare full garbage collection."""
        self._observers = []
        self._on_event = ()
        self.on_unwatched = None
        self.subject = None
        self.replay = None

    def _apply_middlewares(self, event: Event, field: str) -> tuple[Event, str] | None:
        """Pass `event` through the middlewares; None when it is dropped."""
        original = event
        for on_event in self._on_event:
            changed = on_event(self.subject, event)
            if changed is None:
                if field in TERMINALS:  # a run always ends with its terminal event
                    event = original
                    break
                if field in BLOCKS:
                    if self._dropped is None:
                        self._dropped = {}
                    self._dropped[getattr(getattr(event, field), BLOCKS[field][1])] = None
                return None
            event = changed
        new_field: str | None = event.WhichOneof("payload")
        if new_field is None:
            raise ValueError("a middleware returned an event without payload")
        if field in TERMINALS and new_field not in TERMINALS:
            event, new_field = original, field
        if new_field != field:
            event.type = EVENT_TYPES[new_field]
        if new_field in BLOCK_ENDS and self._dropped:
            block_id = getattr(getattr(event, new_field), BLOCK_ENDS[new_field])
            if block_id in self._dropped:
                del self._dropped[block_id]
                return None
        return event, new_field

    def finish(self, terminal: Event) -> Event:
        """Close every open block (innermost first), then append the terminal event."""
        for start in reversed(self.open_blocks):
            self.emit(events.end_of(start))
        return self.emit(terminal)

    def close_nested(self, parent_tool_id: str) -> None:
        """Close the blocks left open by the nested run under `parent_tool_id` (innermost first)."""
        if self.done:
            return
        for start in reversed(self.open_blocks):
            if start.parent_tool_id == parent_tool_id:
                self.emit(events.end_of(start))

    # -- reading -----------------------------------------------------------------------

    async def wait(self) -> None:
        """Wait until the terminal event has been appended."""
        await self._finished.wait()

    async def follow(self, after_seq: int = 0) -> AsyncGenerator[Event, None]:
        """The events with seq > `after_seq`: the appended ones, then the live ones, to the end."""
        index = max(after_seq, 0)
        log = self._events
        new_waiter = asyncio.get_running_loop().create_future
        self.subscribers += 1
        try:
            while True:
                while index < (len(log) if self._visible is None else self._visible):
                    index += 1
                    yield _parsed(log[index - 1])
                if self._done and index >= len(log):
                    return
                if self.handed_over and index >= len(log):
                    raise self._moved(index)
                if self.subscribers == 1 and self._raw is not None:
                    self._pack(self._raw, index)  # read by its only reader: bytes while it waits
                waiter = new_waiter()
                self._waiters.append(waiter)
                if self._handing is not None:
                    self._handed()
                await waiter
        finally:
            self._unsubscribe()

    async def relay(self, after_seq: int, send: Callable[[Event], Awaitable[object]]) -> None:
        """Await `send` with each event with seq > `after_seq`, in order, to the end of the run.

        The events `follow` yields, handed on without an async generator in between:
        on a live stream the reader is woken once per event, and each wake-up then
        resumes one frame less and allocates no awaitable for the generator's step.
        """
        index = max(after_seq, 0)
        log = self._events
        new_waiter = asyncio.get_running_loop().create_future
        self.subscribers += 1
        try:
            while True:
                while index < (len(log) if self._visible is None else self._visible):
                    index += 1
                    # No local keeps the event: while the reader waits, the log holds it
                    # as its bytes only (`_pack`).
                    await send(_parsed(log[index - 1]))
                if self._done and index >= len(log):
                    return
                if self.handed_over and index >= len(log):
                    raise self._moved(index)
                if self.subscribers == 1 and self._raw is not None:
                    self._pack(self._raw, index)  # read by its only reader: bytes while it waits
                waiter = new_waiter()
                self._waiters.append(waiter)
                if self._handing is not None:
                    self._handed()
                await waiter
        finally:
            self._unsubscribe()

    def hand_over(self) -> None:
        """The run's process stopped it without an end, to resume elsewhere: its readers get
        what is left to read, then `RunHandedOver`."""
        self.handed_over = True
        if self._waiters:
            self._wake()

    def _moved(self, after_seq: int) -> RunHandedOver:
        return RunHandedOver(
            f"the service is shutting down and handed run {self.run_id} over: it goes on; "
            f"re-attach (Attach runId {self.run_id}, afterSeq {after_seq}) on another "
            "instance or once the service is back",
            run_id=self.run_id,
            after_seq=str(after_seq),
        )

    def _unsubscribe(self) -> None:
        self.subscribers -= 1
        if self._handing is not None:
            self._handed()
        if self.subscribers == 0 and not self._done and self.on_unwatched is not None:
            self.on_unwatched(self)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class _Held(Journaling):
    """The journal of a held log (`EventLog.hold`): keeps what its run submits, in order,
    for the run's journaling (`journaling`) when the log is released."""

    def __init__(self, journaling: Journaling) -> None:
        super().__init__(journaling.journal)
        self.journaling = journaling
        self.entries: list[tuple[JournalEntry, Readable | None, int]] = []

    def submit(self, entry: JournalEntry, log: Readable | None = None, seq: int = 0) -> None:
        self.entries.append((entry, log, seq))


def _parsed(entry: Event | bytes) -> Event:
    """A log's entry as an event: held as its bytes (`EventLog._pack`), parsed again."""
    return Event.FromString(entry) if isinstance(entry, bytes) else entry


class Emitter:
    """Writes into a run's log on behalf of one scope: the run itself, or one plan task.

    The scope of a nested run (`nested`) also stamps the calling tool's id on its events.
    """

    __slots__ = ("log", "parent_tool_id", "task_id")

    def __init__(self, log: EventLog, task_id: str = "", parent_tool_id: str = "") -> None:
        self.log = log
        self.task_id = task_id
        self.parent_tool_id = parent_tool_id

    @property
    def run_id(self) -> str:
        return self.log.run_id

    @property
    def chat_id(self) -> str:
        return self.log.chat_id

    @property
    def done(self) -> bool:
        return self.log.done

    def emit(self, event: Event) -> Event:
        """Append `event`, stamped with this scope's ids unless it names its own."""
        if self.task_id and not event.task_id:
            event.task_id = self.task_id
        if self.parent_tool_id and not event.parent_tool_id:
            event.parent_tool_id = self.parent_tool_id
        return self.log.emit(event)

    def scope(self, task_id: str) -> Emitter:
        """An emitter for `task_id` on the same log (in the same nested run, if any)."""
        return Emitter(self.log, task_id, self.parent_tool_id)

    def nested(self, tool_id: str) -> Emitter:
        """An emitter for the nested run that the tool call `tool_id` starts."""
        return Emitter(self.log, "", tool_id)

    # -- steps (service/core/run/journal.py) ---------------------------------------------

    @property
    def lane(self) -> Lane:
        """The code this scope's steps run in, one after another: the run's, a task's, a
        nested run's."""
        return (self.parent_tool_id, self.task_id)

    def token(self, prefix: str) -> str:
        """An id for something this scope asks or makes: `prefix` and 8 hex digits, the same
        ones again when a journaled run resumes and gets here again."""
        steps = self.log.steps
        return prefix + secrets.token_hex(4) if steps is None else steps.token(self.lane, prefix)

    def step(
        self,
        kind: str,
        run: Callable[[], Awaitable[T]],
        encode: Callable[[T], Any],
        decode: Callable[[Any], T],
        *,
        key: str = "",
        interrupted: Callable[[], T] | None = None,
    ) -> Awaitable[T]:
        """`run()` as a step of this scope's lane (a journaled run keeps its result; a resumed
        one gives it back without running it again). The step's key is `key`, else the
        next `kind` of the lane ("turn 3"). To be awaited at once: the awaitable of the
        step itself, with no frame of its own in between."""
        steps = self.log.steps
        if steps is None:
            return run()
        full = lane_path(self.lane) + key if key else steps.key(self.lane, kind)
        return steps.run(full, run, encode, decode, interrupted=interrupted)
