"""A run's journal: what lets a run outlive the process that started it.

While a run runs, its journal keeps, in order: what it started with (its agent
as the file said then, its query, its owner), every event it emits, and the
result of every step it completes. A step is a model turn (one streamed call), a
tool call, a wait for the user's answer, a summary of the chat's memory, a pass
of a policy; deltas are not steps, they are events. Entries are written in
batches, one per turn of the event loop, in the order they were made, each
batch once the previous one is durable (`Journaling`). An event is shown to the
run's readers only once it is durable (the log's visible mark): what a client
saw is never lost.

When the run's process dies (or drains, or restarts), another one resumes the
run from its journal (`Replay`): its log is the journaled events, so the
stream goes on under the same run id, from the next seq; the blocks the
interrupted step left open are closed and `run.resume` says so; then the mode
runs again from its start. A step whose result is journaled is not run again:
its result is given at once and it emits nothing. Everything between steps runs
again as it did (the modes are deterministic given their steps' results, and
their ids are drawn from `RunSteps.token`, not at random), and an event it
emits that the journal already holds (the same payload, task and caller) is
not emitted twice. The first step without a result runs for real: a model
turn is asked again; a tool call runs again when its definition says it is
idempotent and is otherwise answered with an error the model sees
(`INTERRUPTED`); a wait waits again.

Steps are keyed within their lane: the code that runs one after another — the
run's own, one plan task's, one subagent's nested run — so that lanes running
at once (parallel plan tasks) keep their own keys whatever their order.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, TypeVar

import orjson

from service.core.events import Event, to_dict

log = logging.getLogger("agw.journal")

T = TypeVar("T")

EntryKind = Literal["begin", "event", "start", "step", "resume", "end"]
#: (caller tool id, task id): the code that runs one step after another.
Lane = tuple[str, str]
RUN_LANE: Lane = ("", "")

#: The events a step streams while it runs: never emitted again when a run resumes.
DELTAS = frozenset({"reasoning_delta", "content_delta", "tool_args", "action_args"})

#: The error a tool call gets when the run resumes after it began and before it ended, and
#: its tool may not run twice.
INTERRUPTED = (
    "interrupted: the service running this call stopped before it finished; the tool is not "
    "marked idempotent, so it was not run again, and it may or may not have taken effect"
)


class JournalEntry(NamedTuple):
    """One write of a run's journal: its start, an event, a step's start or result, a
    resumption, or its end (after which its entries are forgotten). (A tuple: one is made
    per event, on the per-delta path.)"""

    run_id: str
    kind: EntryKind
    key: str = ""  # an event's seq, a step's key
    data: bytes = b""  # an event's bytes; JSON for the rest
    # How often the run had resumed when its owner wrote this: the journal keeps no entry
    # of an owner the run has since been taken from (one found lost, yet still running).
    attempt: int = 0


@dataclass(slots=True)
class JournaledRun:
    """A run as its journal kept it (of each owner it had, what it wrote before the run
    was taken from it: a backend keeps no entry older than the run's last resumption)."""

    run_id: str
    chat_id: str
    record: dict[str, Any]  # what it started with
    steps: dict[str, Any] = field(default_factory=dict)  # key -> result JSON
    started: set[str] = field(default_factory=set)  # keys of steps begun without a result
    events: list[Event] = field(default_factory=list)
    attempts: int = 0  # resumptions so far

    @property
    def ended(self) -> bool:
        """Whether its terminal event is journaled (only its keeping was left)."""
        return bool(self.events) and self.events[-1].WhichOneof("payload") in TERMINALS

    @property
    def losses(self) -> int:
        """How many of its owners so far were lost while running it: stopped without
        handing it over (a crash, a kill, a lost lease). A run parked or handed over at a
        drain is not lost, however often that happens."""
        owners = self.attempts + 1
        handed = sum(1 for k in range(owners) if handover_key(k) in self.steps)
        return owners - handed

    @property
    def parked(self) -> bool:
        """Whether its last owner parked it (it waits for an answer, and holds nothing)."""
        last = self.steps.get(handover_key(self.attempts))
        return isinstance(last, dict) and last.get("reason") == PARK


def handover_key(attempt: int) -> str:
    """The key of the step its owner of `attempt` journals when it stops the run without
    ending it: a drain's hand-over, or parking it."""
    return f"handover {attempt}"


#: How a run was handed over: parked while it only waits for answers (see `RunSteps.idle`).
PARK, DRAIN = "park", "drain"


TERMINALS = frozenset({"run_complete", "run_error", "run_cancel"})


def lane_of(task_id: str, parent_tool_id: str) -> Lane:
    return (parent_tool_id, task_id)


def lane_path(lane: Lane) -> str:
    """The lane as a key prefix: "" for the run's own, "task_2/", "agent h1/", …"""
    caller, task = lane
    return (f"agent {caller}/" if caller else "") + (f"task {task}/" if task else "")


class Readable(Protocol):
    """A run's log, whose readers see an event once it is durable (`EventLog.publish`)."""

    def publish(self, seq: int) -> None: ...


class JournalWriter(Protocol):
    """What `Journaling` writes to (the `RunJournal` port, service/core/ports.py)."""

    async def write(self, entries: Sequence[JournalEntry]) -> None: ...

    def write_now(self, entries: Sequence[JournalEntry]) -> bool: ...


class Journaling:
    """Writes the journal entries of a process's runs, in order, one batch per loop turn.

    A batch is written once the one before it is durable; then the events it held
    are shown to their runs' readers (`EventLog.publish`). A journal that can make a
    batch durable without waiting (`write_now`: a local SQLite file commits to its
    write-ahead log in microseconds) writes it at the end of the loop turn that made
    it, and its readers are woken in that same turn; otherwise, and whenever a batch
    is still being written, a writer task writes the batches one after another.
    """

    def __init__(self, journal: JournalWriter) -> None:
        self.journal = journal
        self._pending: list[JournalEntry] = []
        self._published: dict[Readable, int] = {}  # of the pending batch: log -> its last seq
        self._writer: asyncio.Task[None] | None = None
        self._due = False  # the end of this loop turn is to write the pending batch
        self.failed = False

    def submit(self, entry: JournalEntry, log: Readable | None = None, seq: int = 0) -> None:
        """Queue `entry`; with `log`, `seq` is shown to its readers once `entry` is durable."""
        self._pending.append(entry)
        if log is not None:
            self._published[log] = seq
        if self._writer is None and not self._due:
            self._due = True
            # What the rest of this loop turn adds goes in too.
            asyncio.get_running_loop().call_soon(self._turn)

    def now(self) -> None:
        """Write the pending batch now rather than at the end of this loop turn (for a run
        about to wait for its readers: they see its events a loop turn sooner)."""
        if self._due:
            self._turn()

    def _turn(self) -> None:
        """Write the pending batch at once if the journal can, else start the writer task."""
        self._due = False
        if self._writer is not None or not self._pending:
            return  # the writer task takes what is pending
        batch, published = self._pending, self._published
        try:
            written = self.journal.write_now(batch)
        except Exception:
            self._failed()
            written = True  # the runs go on unjournaled
        if not written:
            self._writer = asyncio.get_running_loop().create_task(
                self._write(), name="journal-writer"
            )
            return
        self._pending, self._published = [], {}
        for event_log, seq in published.items():
            event_log.publish(seq)

    async def _write(self) -> None:
        try:
            while self._pending:
                await asyncio.sleep(0)  # what the rest of this loop turn adds goes in too
                batch, self._pending = self._pending, []
                published, self._published = self._published, {}
                try:
                    await self.journal.write(batch)
                except Exception:
                    self._failed()
                for event_log, seq in published.items():
                    event_log.publish(seq)
        finally:
            self._writer = None

    def _failed(self) -> None:
        if not self.failed:
            log.exception("could not write the runs' journal; runs go on unjournaled")
        self.failed = True

    async def flush(self) -> None:
        """Wait until everything submitted so far is written."""
        while self._writer is not None or self._pending:
            if self._writer is not None:
                await asyncio.shield(self._writer)
            else:
                self._turn()


class Replay:
    """A resumed run's journal, as its mode runs again: the steps' results to give, and the
    events already in its log, not to emit again."""

    def __init__(self, journaled: JournaledRun) -> None:
        self.steps = journaled.steps
        self.started = journaled.started
        self.attempt = journaled.attempts
        self._held = Counter(identity(e) for e in journaled.events if _replayable(e))
        self._left = sum(self._held.values())
        self.floors = block_floors(journaled.events)
        # The answers its waits were given (`request.submit`) whose step has no result yet:
        # accepted, journaled, and not yet taken by the run when its owner stopped.
        self.answers = {
            e.request_submit.tool_id: to_dict(e.request_submit.payload)
            for e in journaled.events
            if e.WhichOneof("payload") == "request_submit"
        }

    def forget(self, events: Iterable[Event]) -> None:
        """`events` are to be emitted again when their step runs again: the starts of the
        blocks the interrupted steps left open (closed when the run resumed). A tool call's
        block keeps its id, the model's: its start must be shown again."""
        for event in events:
            key = identity(event)
            if self._held[key] > 0:
                self._held[key] -= 1
                self._left -= 1

    def holds(self, event: Event, field_name: str) -> bool:
        """Whether `event` is already in the log: then it is taken out of the held ones."""
        if not self._left or field_name in DELTAS:
            return False
        key = identity(event)
        if self._held[key] <= 0:
            return False
        self._held[key] -= 1
        self._left -= 1
        return True


def block_floors(events: Iterable[Event]) -> dict[str, int]:
    """The highest n of each text block id prefix `{…}_r_` / `{…}_c_` among `events`."""
    floors: dict[str, int] = {}
    for event in events:
        field_name = event.WhichOneof("payload")
        if field_name == "reasoning_start":
            block_id = event.reasoning_start.reasoning_id
        elif field_name == "content_start":
            block_id = event.content_start.content_id
        else:
            continue
        prefix, _, number = block_id.rpartition("_")
        if number.isdigit():
            key = prefix + "_"
            floors[key] = max(floors.get(key, 0), int(number))
    return floors


def _replayable(event: Event) -> bool:
    return event.WhichOneof("payload") not in DELTAS


def identity(event: Event) -> tuple[str, str, str, bytes]:
    """What makes two events the same one: kind, task, caller and payload (not seq or time)."""
    field_name = event.WhichOneof("payload") or ""
    payload = getattr(event, field_name).SerializeToString(deterministic=True)
    return field_name, event.task_id, event.parent_tool_id, payload


#: The key of the step the current code runs in (a wait inside a tool call, a subagent's).
_STEP: contextvars.ContextVar[str] = contextvars.ContextVar("agw_step", default="")


class RunSteps:
    """The steps of one run: their keys, their journaled results, the ids they draw, and
    those running now."""

    def __init__(self, run_id: str, journaling: Journaling, replay: Replay | None = None) -> None:
        self.run_id = run_id
        self.journaling = journaling
        self.replay = replay
        self.attempt = replay.attempt + 1 if replay is not None else 0  # this owner's
        self._counters: Counter[tuple[Lane, str]] = Counter()
        self._running: dict[str, str] = {}  # key -> the step it runs in ("": none)
        self._waits_in: Counter[str] = Counter()  # key -> its steps that are waits, running

    @property
    def idle(self) -> bool:
        """Whether all the run does now is wait for answers: some steps run, and each is a
        wait or runs only waits (a tool call asking a question, a subagent waiting)."""
        running = self._running
        waits_in = self._waits_in
        return bool(running) and all(is_wait(key) or waits_in[key] > 0 for key in running)

    def hand_over(self, reason: str) -> None:
        """Journal that this owner stops the run without ending it (`PARK`, `DRAIN`)."""
        self._done(handover_key(self.attempt), {"reason": reason})

    def key(self, lane: Lane, kind: str) -> str:
        """The next key of a step of `kind` in `lane` ("turn 3", "summary 1", …)."""
        self._counters[(lane, kind)] += 1
        return f"{lane_path(lane)}{kind} {self._counters[(lane, kind)]}"

    def token(self, lane: Lane, prefix: str, size: int = 8) -> str:
        """An id for something the run asks or makes (a question, an approval, a plan): the
        same one each time the run's code gets there, in this run and when it resumes."""
        self._counters[(lane, prefix)] += 1
        seed = f"{self.run_id}|{lane_path(lane)}|{prefix}|{self._counters[(lane, prefix)]}"
        return prefix + hashlib.sha256(seed.encode()).hexdigest()[:size]

    async def run(
        self,
        key: str,
        run: Callable[[], Awaitable[T]],
        encode: Callable[[T], Any],
        decode: Callable[[Any], T],
        *,
        interrupted: Callable[[], T] | None = None,
    ) -> T:
        """The result of step `key`: its journaled one, or `run()`'s, then journaled.

        A step that began before the run was interrupted and has no result is run
        again, unless `interrupted` gives what stands for it instead.
        """
        replay = self.replay
        if replay is not None:
            if key in replay.steps:
                return decode(replay.steps[key])
            if interrupted is not None and key in replay.started:
                value = interrupted()
                self._done(key, encode(value))
                return value
        self.journaling.submit(JournalEntry(self.run_id, "start", key, attempt=self.attempt))
        parent = _STEP.get()
        if parent not in self._running:  # (a step of another run's code)
            parent = ""
        wait = is_wait(key)
        self._running[key] = parent
        if wait and parent:
            self._waits_in[parent] += 1
        token = _STEP.set(key)
        try:
            value = await run()
        finally:
            _STEP.reset(token)
            del self._running[key]
            if wait and parent:
                self._waits_in[parent] -= 1
        self._done(key, encode(value))
        return value

    def _done(self, key: str, result: Any) -> None:
        entry = JournalEntry(self.run_id, "step", key, dump_json(result), self.attempt)
        self.journaling.submit(entry)


#: What orjson hands to `str` as the standard library's json does (`default=str`).
_AS_STR = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def dump_json(value: Any) -> bytes:
    """`value` as compact UTF-8 JSON, what JSON cannot hold as its `str` (orjson; the
    standard library's json for what orjson refuses: non-string keys, integers beyond 64
    bits)."""
    try:
        return orjson.dumps(value, default=str, option=_AS_STR)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str).encode()


def is_wait(key: str) -> bool:
    """Whether the step of `key` waits for a user's answer ("task t1/wait t_…")."""
    return key.rpartition("/")[2].startswith("wait ")


def entries_of(run_id: str, events: Iterable[Event]) -> list[JournalEntry]:
    """Journal entries for `events` (a run's first ones, journaled as it begins)."""
    return [JournalEntry(run_id, "event", str(e.seq), e.SerializeToString()) for e in events]
