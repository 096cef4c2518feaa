"""The life of this process's runs: admitted, claimed, prepared, launched, kept, released.

1. **Admit**: a query is refused while the service drains or when `max_active_runs`
   run already.
2. **Claim**: per chat, at most one run is active. A query on a busy chat follows
   its multitask strategy (the query's, else the service's): reject it, enqueue it
   until the active run ends, or interrupt the active run. The claim is the run
   bus's `register`, which another replica may win first.
3. **Prepare**: what may fail, fails before the claim — the chat's last run
   settled, its memory read, the query's references made into content parts.
4. **Launch**: the run's chat recorder, its context, its task. The rest of its
   opening — its journal's begin record, its first events (`request.query`,
   `chat.start` on a new chat, `run.start`) journaled and shown to its readers, its
   chat's query record — comes once the task's first model request is out, so that
   the provider's time to first token hides it.
5. **Keep**: after the terminal event the chat is freed, the run's records are
   written and its log kept (`RunLog`); a run nobody follows is cancelled after
   `unwatched_run_ttl_s` unless it waits for a Submit.
6. **Release**: `retention_s` after its end the run is forgotten (it is then
   re-joined from the run log).
7. **Park**: a journaled run that does nothing but wait for answers for
   `park_after_s` is parked: its task stops, its log and its open waits stay. An
   answer, its earliest wait's deadline, or a cancel wakes it: it runs again here
   from its journal (service/core/run/journal.py) and takes the answer.
8. **Drain**: no new run; a journaled run that another replica can go on with at once
   (the run bus knows one up and not draining) is handed over after a short delay (for
   load balancers to see the service's health say NOT_SERVING), and so is a parked
   one; the others get a grace period, then are handed over (journaled: to resume when
   a process starts again) or cancelled. A hand-over or a parking is journaled (its
   `DRAIN` or `PARK` mark): it is not a lost owner (`JournaledRun.losses`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
import weakref
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from service.core import events
from service.core.agents.definition import AgentDefinition
from service.core.agents.schema import StageName
from service.core.chats.memory import remembered
from service.core.chats.recorder import ChatRecorder, user_message
from service.core.chats.uploads import Uploads
from service.core.commands import DebugLevel, QueryCommand, Strategy
from service.core.errors import (
    AgwError,
    ChatBusy,
    ChatNotFound,
    Overloaded,
    OwnerLost,
    ShuttingDown,
)
from service.core.ids import chat_name_of
from service.core.middleware import hooks
from service.core.ports import ChatStore, RunBus, RunJournal, RunLog
from service.core.run.binding import BoundModel, bind_stages
from service.core.run.context import Mode, RunQuery, RunServices, new_context
from service.core.run.eventlog import EventLog
from service.core.run.journal import (
    DRAIN,
    PARK,
    JournaledRun,
    JournalEntry,
    Journaling,
    Replay,
    RunSteps,
    dump_json,
)
from service.core.run.runner import execute
from service.core.run.state import Accounting, Pricing, RunState
from service.core.run.transcript import PastRun
from service.core.run.turn import Ids, journaled_turns
from service.core.run.window import fit_memory
from service.core.values import OpenWait, RunRef

log = logging.getLogger("agw.runtime")


@dataclass(frozen=True, slots=True)
class RunOptions:
    """What the service allows its runs, and the defaults a query does not choose."""

    max_active_runs: int = 1000
    max_message_bytes: int = 1024 * 1024  # a query's message, in UTF-8
    memory_runs: int = 20
    multitask_strategy: Strategy = "reject"
    unwatched_run_ttl_s: float = 120.0
    retention_s: float = 60.0
    image_input: Any = None  # callable(provider key) -> bool; None: never
    inline_text_bytes: int = 32 * 1024
    middlewares: tuple[object, ...] = ()
    pricing: Pricing | None = None
    context_max_tokens: int = 0  # budget of the chat memory given to the model; 0: no limit
    context_length: int = 32_768  # a model's context length when nothing else says (window.py)
    currency: str = "USD"
    debug_level: DebugLevel = DebugLevel.OFF  # when the query does not choose one
    resume_attempts: int = 3  # a run resumed this often and lost again ends OWNER_LOST
    park_after_s: float = 30.0  # a journaled run that only waits this long is parked; 0: never
    replica: str = ""  # this process, as `run.resume` names it


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A run ready to be registered, and what its start needs."""

    run: RunState
    query_event: events.Event
    query_record: dict[str, Any]
    new_chat: bool
    memory: list[PastRun]
    parts: list[Any]
    user_message: dict[str, Any]  # as the chat records it


@dataclass(eq=False)
class RunLifecycle:
    """Starts, keeps and ends the runs this process executes."""

    chats: ChatStore
    run_log: RunLog
    bus: RunBus
    uploads: Uploads
    services: RunServices
    options: RunOptions
    modes: Mapping[str, Mode] = field(default_factory=dict)  # to resume a run in its mode
    journal: RunJournal | None = None  # where runs are journaled, to outlive this process
    draining: bool = False
    _active: set[RunState] = field(default_factory=set)  # the runs this process executes
    # The latest recorder of each chat, and one lock per chat a run is starting on.
    _recorders: dict[str, ChatRecorder] = field(default_factory=dict)
    _starting: weakref.WeakValueDictionary[str, asyncio.Lock] = field(
        default_factory=weakref.WeakValueDictionary
    )
    _finishing: set[asyncio.Task[None]] = field(default_factory=set)
    _journaling: Journaling | None = field(init=False, default=None)
    # Parking: per run, its pending park check or (parked) its deadline's wake-up; the runs
    # to park as soon as they only wait (they were parked before they resumed here); the
    # parked runs asked to wake while their task was still stopping; the wakes under way.
    _timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    _park_at_once: set[str] = field(default_factory=set)
    _wake_pending: set[str] = field(default_factory=set)
    _waking: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _on_unwatched: Callable[[EventLog], None] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # The runs' hook for their last reader leaving, bound once for all of them.
        self._on_unwatched = self._unwatched
        if self.journal is not None:
            self._journaling = Journaling(self.journal)
            if self.options.park_after_s > 0:
                self.services.waits.observe(self._waits_changed)
                self.services.waits.on_parked_answer = self.wake

    @property
    def active_runs(self) -> int:
        """The runs this process executes now (not counting the parked ones)."""
        return len(self._active)

    @property
    def parked_runs(self) -> int:
        """The runs of this process parked now: they wait, with no task."""
        return sum(1 for run in self.bus.local_runs().values() if run.parked and not run.done)

    # -- admit, claim, prepare, launch -------------------------------------------------

    def admit(self) -> None:
        """Refuse a new run while draining or when too many run already."""
        if self.draining:
            raise ShuttingDown("the service is shutting down; retry on another instance")
        limit = self.options.max_active_runs
        if len(self._active) >= limit:
            raise Overloaded(
                f"too many active runs: {len(self._active)} of the {limit} that fit are running; "
                "retry later",
                limit=str(limit),
            )

    async def start(
        self,
        command: QueryCommand,
        agent: AgentDefinition,
        mode: Mode,
        models: Mapping[StageName, BoundModel],
        chat_id: str,
    ) -> RunState:
        """Claim `chat_id` for a new run of `agent` and launch it; the run, streaming."""
        provider = models[agent.stage_names[0]].provider  # for the references' content parts
        lock = self._starting.setdefault(chat_id, asyncio.Lock())
        async with lock:  # one query at a time gets through the start of a chat's run
            while True:
                await self._wait_for_chat(chat_id, command.strategy)
                prepared = await self._prepare(command, agent, chat_id, provider)
                run = prepared.run
                clash = await self.bus.register(run, new_chat=prepared.new_chat)
                if clash is None:
                    break
                # another process started a run on the chat in the meantime
                await self._meet(clash, chat_id, command.strategy)
            try:
                return self._launch(prepared, command, agent, mode, models)
            except BaseException:
                await self.bus.ended(run)
                await self.bus.settled(run)
                await self.bus.release(run.run_id)
                raise

    async def _wait_for_chat(self, chat_id: str, strategy: Strategy | None) -> None:
        while (active := await self.bus.active_of(chat_id)) is not None:
            await self._meet(active, chat_id, strategy)

    async def _meet(self, active: RunRef, chat_id: str, strategy: Strategy | None) -> None:
        """Deal with the chat's active run by the strategy: refuse, interrupt it, or wait."""
        strategy = strategy or self.options.multitask_strategy
        if strategy == "reject":
            raise ChatBusy(
                f"chat {chat_id!r} has an active run {active.run_id!r}; wait for it to end, "
                "cancel it, or query with multitaskStrategy ENQUEUE or INTERRUPT",
                chat_id=chat_id,
                run_id=active.run_id,
            )
        if strategy == "interrupt":
            await self.bus.cancel(active.run_id, "interrupt")
        await self.bus.wait_ended(active.run_id)

    async def _prepare(
        self, command: QueryCommand, agent: AgentDefinition, chat_id: str, provider: str
    ) -> _Prepared:
        """Everything a run needs before it is registered (what may fail, fails here)."""
        self.admit()
        previous = self._recorders.get(chat_id)
        if previous is not None:  # the chat's last run must be fully written before we read it
            await previous.closed()
        await self.bus.wait_settled(chat_id)  # also when it ran in another process
        new_chat = await self.chats.summary(chat_id) is None
        memory = (
            [] if new_chat else remembered(await self.chats.read(chat_id), self.options.memory_runs)
        )
        parts = await self._reference_parts(command, provider)
        query_event = events.request_query(
            command.request_id or str(uuid.uuid4()),
            role=command.role,
            message=command.message,
            agent_key=command.agent_key,
            references=command.references,
            params=command.params,
            scene=command.scene,
            stream=command.stream,
        )
        query_record = events.to_dict(query_event.request_query)
        query_record["chatId"] = chat_id
        run = self._run_state(command.run_id or secrets.token_hex(8), chat_id, agent, command)
        stored = user_message(command.message, parts)
        return _Prepared(run, query_event, query_record, new_chat, memory, parts, stored)

    def _run_state(
        self,
        run_id: str,
        chat_id: str,
        agent: AgentDefinition,
        command: QueryCommand,
        journaled: JournaledRun | None = None,
    ) -> RunState:
        """The state of a run of `agent` for `command` (of a resumed one: `journaled`)."""
        options = self.options
        journaling = self._journaling
        log = EventLog(
            run_id,
            chat_id,
            options.middlewares,
            journaling=journaling,
            journaled=journaled.events if journaled is not None else (),
        )
        if journaling is not None:
            replay = Replay(journaled) if journaled is not None else None
            log.steps = RunSteps(run_id, journaling, replay)
        run = RunState(
            log,
            agent.key,
            debug_level=(
                options.debug_level if command.debug_level is None else command.debug_level
            ),
            accounting=Accounting(currency=options.currency, pricing=options.pricing),
            owner=command.principal,
        )
        run.resumable = agent.resumable
        return run

    async def _reference_parts(self, command: QueryCommand, provider: str) -> list[Any]:
        image_input = bool(self.options.image_input and self.options.image_input(provider))
        parts: list[Any] = []
        for reference in command.references:
            if reference.id:
                parts += await self.uploads.content_parts(
                    reference.id,
                    image_input=image_input,
                    inline_text_bytes=self.options.inline_text_bytes,
                    owner=command.principal,
                )
            elif reference.url:
                parts.append({"type": "text", "text": f"[reference {reference.url}]"})
        return parts

    def _launch(
        self,
        start: _Prepared,
        command: QueryCommand,
        agent: AgentDefinition,
        mode: Mode,
        models: Mapping[StageName, BoundModel],
    ) -> RunState:
        """Start the registered run: its recorder, its task, then the rest of its opening."""
        run = start.run
        options = self.options
        for on_run_start in hooks(options.middlewares, "on_run_start"):
            on_run_start(run)
        self._active.add(run)
        recorder = ChatRecorder(
            self.chats,
            run,
            start.query_record,
            start.user_message,
            agent.stage_names[0],
            owner=run.owner,
        )
        self._recorders[run.chat_id] = recorder
        # The opening events, their journal entries and their readers wait for `_opened`,
        # after the task's first model request is out (they come before anything the task
        # emits until then).
        opening = [start.query_event]
        if start.new_chat:
            opening.append(events.chat_start(chat_name_of(command.message)))
        opening.append(events.run_start(agent.key))
        run.log.hold(opening)
        self._execute(run, recorder, command, agent, mode, models, start.memory, start.parts)
        _after_first_step(self._opened, run, recorder, command, agent, start)
        return run

    def _opened(
        self,
        run: RunState,
        recorder: ChatRecorder,
        command: QueryCommand,
        agent: AgentDefinition,
        start: _Prepared,
    ) -> None:
        """The rest of a new run's opening, once its first model request is out: its chat's
        query record, its journal's begin record, its opening events (unless the task
        emitted something meanwhile, which they came before), shown to its readers once
        journaled."""
        try:
            recorder.open()
            if self._journaling is not None:
                self._begin(run, command, agent, start)
        except Exception as error:  # a bug: the run cannot be kept as it should
            log.exception("could not open run %s", run.run_id)
            run.fail(AgwError(f"internal error ({type(error).__name__})"))
        finally:
            run.log.release()

    def _execute(
        self,
        run: RunState,
        recorder: ChatRecorder,
        command: QueryCommand,
        agent: AgentDefinition,
        mode: Mode,
        models: Mapping[StageName, BoundModel],
        memory: list[PastRun],
        parts: list[Any],
    ) -> None:
        """Start the run's task: `mode` in the run's context."""
        out = run.log.scope()
        if self.options.context_max_tokens:
            memory = fit_memory(memory, self.options.context_max_tokens, out)
        model_user: dict[str, Any] = {"role": command.role or "user", "content": command.message}
        if parts:
            model_user["content"] = [{"type": "text", "text": command.message}, *parts]
        context = new_context(
            run,
            out,
            agent,
            RunQuery.of(command, memory, model_user),
            self.services,
            Ids(run.run_id, self._floors(run)),
            models=models,
        )
        if not command.background:  # a background run (Start) is not abandoned unfollowed
            run.log.on_unwatched = self._on_unwatched
        run.task = asyncio.create_task(execute(context, mode), name=f"run-{run.run_id}")
        run.task.add_done_callback(_TaskEnd(self, run, recorder, agent.mode))

    @staticmethod
    def _floors(run: RunState) -> dict[str, int]:
        replay = run.log.steps.replay if run.log.steps is not None else None
        return replay.floors if replay is not None else {}

    def _begin(
        self, run: RunState, command: QueryCommand, agent: AgentDefinition, start: _Prepared
    ) -> None:
        """Journal what the run starts with: enough to start it again elsewhere."""
        record = {  # and "agent": the definition's JSON, made once
            "agentKey": agent.key,
            "mode": agent.mode,
            "command": command.to_record(),
            "query": start.query_record,
            "userMessage": start.user_message,
            "parts": start.parts,
            "newChat": start.new_chat,
        }
        data = b'{"agent":' + agent.json_bytes + b"," + dump_json(record)[1:]
        assert self._journaling is not None
        self._journaling.submit(JournalEntry(run.run_id, "begin", run.chat_id, data))

    def _unwatched(self, log: EventLog) -> None:
        """The last reader of a run's log left (its `on_unwatched`)."""
        run = log.subject
        if isinstance(run, RunState):
            self._arm_unwatched_timer(run)

    def _arm_unwatched_timer(self, run: RunState, *, waited: bool = False) -> None:
        """Cancel `run` once nobody has followed it for `unwatched_run_ttl_s`, unless it
        waits for a `Submit`: a client answering later (an A2A or AG-UI follow-up, a page
        reopened) finds it still waiting, bounded by the wait's own time-out, and has one
        more TTL after the answer to follow it again."""

        def expire() -> None:
            if run.log.subscribers or run.done:
                return
            waiting = bool(self.services.waits.waiting(run.run_id))
            if waiting or waited:
                self._arm_unwatched_timer(run, waited=waiting)
                return
            log.info(
                "run %s had no watcher for %.0fs; cancelling",
                run.run_id,
                self.options.unwatched_run_ttl_s,
            )
            run.cancel("abandoned")

        asyncio.get_running_loop().call_later(self.options.unwatched_run_ttl_s, expire)

    # -- keep, release -----------------------------------------------------------------

    def _ended(self, run: RunState, recorder: ChatRecorder, mode: str) -> None:
        self._active.discard(run)
        if run.parked and not run.done:  # it waits with no task, until something wakes it
            run.let_go(parked=True)
            log.info("run %s parked", run.run_id)
            if run.run_id in self._wake_pending:
                self._wake_pending.discard(run.run_id)
                self.wake(run.run_id)
            return
        self._cancel_timer(run.run_id)
        run.let_go()
        if not run.done:  # handed over (a drain): its journal goes on elsewhere
            log.info("run %s handed over", run.run_id)
            run.log.hand_over()
            self._track(self._hand_over(run), f"hand-over-{run.run_id}")
            return
        _log_run_end(run, mode)
        for on_run_end in hooks(self.options.middlewares, "on_run_end"):
            try:
                on_run_end(run, run.terminal)
            except Exception:
                log.exception("middleware on_run_end failed for run %s", run.run_id)
        self._track(self._keep(run, recorder), f"keep-{run.run_id}")

    def _track(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run `work` in a task of its own, which `flush` waits for."""
        task = asyncio.create_task(work, name=name)
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def _hand_over(self, run: RunState) -> None:
        """Once its journal has everything and its chat the records sent, let the bus give
        the run to another replica (which counts the chat's records of the run: one still
        being written would be written again)."""
        try:
            if self._journaling is not None:
                await self._journaling.flush()
            recorder = self._recorders.get(run.chat_id)  # (the chat's run is this one)
            if recorder is not None:
                await recorder.written()
            await self.bus.hand_over(run)
        except Exception:
            log.exception("could not hand run %s over", run.run_id)

    async def _keep(self, run: RunState, recorder: ChatRecorder) -> None:
        """After the run's end: free its chat, write its records, keep its log, forget it."""
        try:
            await run.log.published()  # the bus sends other replicas what readers may see
            await self.bus.ended(run)
        except Exception:
            log.exception("could not mark run %s ended", run.run_id)
        try:
            # Its log is handed to the run log while its chat's last records are being
            # written (a fenced run's log is kept by the replica that took it over): the
            # disk may take them together.
            unsaved: Exception | None = None
            if not run.fenced:
                try:
                    await self.run_log.save(run.run_id, run.log)
                except Exception as error:
                    unsaved = error
            await recorder.closed()
            if self._recorders.get(run.chat_id) is recorder:
                del self._recorders[run.chat_id]
            await self.bus.settled(run)
            if unsaved is not None:
                raise unsaved
            steps = run.log.steps
            if not run.fenced and self._journaling is not None and steps is not None:
                self._journaling.submit(JournalEntry(run.run_id, "end", attempt=steps.attempt))
        except Exception:
            log.exception("could not keep the log of run %s", run.run_id)
        asyncio.get_running_loop().call_later(self.options.retention_s, self._release, run.run_id)

    def _release(self, run_id: str) -> None:
        self._track(self.bus.release(run_id), f"release-{run_id}")

    # -- resume ------------------------------------------------------------------------

    async def resume_unfinished(self, reason: str) -> list[RunState]:
        """Resume every run the journal holds unfinished (the embedded default, at start-up:
        the runs the last process left)."""
        if self.journal is None:
            return []
        resumed = []
        for run_id in await self.journal.unfinished():
            try:
                run = await self.resume(run_id, reason)
            except Exception:
                log.exception("could not resume run %s", run_id)
                continue
            if run is not None:
                resumed.append(run)
        return resumed

    async def resume_lost(self, run_id: str, reason: str = "owner_lost") -> RunState | None:
        """Go on here with a run whose owner the bus found lost, or which a draining replica
        handed over (reason `drain`; see `RunBus.on_lost`)."""
        return await self.resume(run_id, reason, adopt=True)

    async def resume(self, run_id: str, reason: str, *, adopt: bool = False) -> RunState | None:
        """Go on with run `run_id` from its journal: its log as it was, its open blocks
        closed, `run.resume`, then its mode again from its last completed step.

        A run whose journal ended it (only its keeping was left) is kept; one that lost
        its process `resume_attempts` times already, or whose agent does not resume, ends
        with `run.error` OWNER_LOST. A hand-over by a draining process (reason `drain`) is
        not counted: a rolling restart moves a run as often as it takes. None when the
        journal has no such run.
        """
        assert self.journal is not None and self._journaling is not None
        journaled = await self.journal.load(run_id)
        if journaled is None:
            return None
        record = journaled.record
        chat_id = journaled.chat_id
        command = QueryCommand.from_record(record["command"])
        agent = AgentDefinition.model_validate(
            record["agent"], context={"key": record["agentKey"]}
        ).in_mode(record["mode"])
        run = self._run_state(run_id, chat_id, agent, command, journaled)
        if adopt:  # its owner was declared lost here: it is this replica's now
            if not await self.bus.adopt(run):
                log.warning("run %s not resumed: another replica took it over", run_id)
                return None
        elif (clash := await self.bus.register(run)) is not None:
            log.warning("run %s not resumed: chat %s has run %s", run_id, chat_id, clash.run_id)
            return None
        try:
            records = await self.chats.read(chat_id)
        except ChatNotFound:
            records = []  # the run's first records were never written
        recorder = ChatRecorder.resume(
            self.chats,
            run,
            record["query"],
            record["userMessage"],
            agent.stage_names[0],
            owner=run.owner,
            journaled=journaled.events,
            turns=journaled_turns(journaled.steps),
            written=sum(1 for r in records if r.get("runId") == run_id and r["_type"] == "step"),
        )
        self._recorders[chat_id] = recorder
        self._active.add(run)
        for on_run_start in hooks(self.options.middlewares, "on_run_start"):
            on_run_start(run)
        attempt = journaled.attempts + 1  # this owner's: the journal keeps no older one's now
        self._journaling.submit(JournalEntry(run_id, "resume", str(attempt), attempt=attempt))
        out = run.log.scope()
        if journaled.ended:
            self._ended(run, recorder, agent.mode)
            return run
        interrupted_blocks = run.log.open_blocks  # what the interrupted steps left open
        for start in reversed(interrupted_blocks):
            out.emit(events.end_of(start))
        losses = journaled.losses
        if losses > self.options.resume_attempts or not agent.resumable:
            why = (
                f"the run could not go on after its process stopped {losses} times"
                if agent.resumable
                else f"agent {agent.key!r} does not resume its runs (resumable: false)"
            )
            lost = OwnerLost(why, attempts=str(losses - 1))
            out.emit(events.run_error(lost.reason, lost.message, lost.metadata))
            self._ended(run, recorder, agent.mode)
            return run
        interrupted = ", ".join(sorted(journaled.started))
        out.emit(events.run_resume(reason, interrupted, self.options.replica, attempt))
        run.log.replay = run.log.steps.replay if run.log.steps is not None else None
        if run.log.replay is not None:  # their steps run again, and open them again
            run.log.replay.forget(interrupted_blocks)
        memory = remembered(
            [r for r in records if r.get("runId") != run_id], self.options.memory_runs
        )
        mode = self.modes[agent.mode]
        models = bind_stages(self.services.models, agent)
        if journaled.parked:  # it was parked: park it again as soon as it waits again
            self._park_at_once.add(run_id)
        self._execute(run, recorder, command, agent, mode, models, memory, record["parts"])
        log.info("run %s resumed (%s, attempt %d)", run_id, reason, attempt)
        return run

    # -- park, wake --------------------------------------------------------------------

    def _waits_changed(self, run_id: str, waits: list[OpenWait]) -> None:
        """A run's waits opened or closed: when it waits, look whether to park it."""
        if not waits or run_id in self._timers:
            return
        run = self.bus.local(run_id)
        if run is None or run.parked or run not in self._active:
            return
        delay = 0.0 if run_id in self._park_at_once else self.options.park_after_s
        loop = asyncio.get_running_loop()
        self._timers[run_id] = loop.call_later(delay, self._park_if_idle, run)

    def _park_if_idle(self, run: RunState) -> None:
        """Park `run` if all it does is wait for answers; else look again later."""
        run_id = run.run_id
        self._timers.pop(run_id, None)
        steps, journaling = run.log.steps, self._journaling
        if run.done or run.parked or run not in self._active or not run.resumable:
            return
        if steps is None or journaling is None or journaling.failed:
            return
        waits = self.services.waits
        if not waits.waiting(run_id):
            return
        loop = asyncio.get_running_loop()
        if not steps.idle:  # it waits, and works on something else too
            self._timers[run_id] = loop.call_later(
                self.options.park_after_s, self._park_if_idle, run
            )
            return
        self._park_at_once.discard(run_id)
        steps.hand_over(PARK)
        deadline = waits.park(run_id)
        run.parked = True
        run.waker = lambda: self.wake(run_id)
        run.park()
        if deadline is not None:
            delay = max(0.0, deadline - time.time())
            self._timers[run_id] = loop.call_later(delay, self.wake, run_id)

    def wake(self, run_id: str) -> None:
        """Run the parked run `run_id` again: it was answered, its wait's time is up, or it
        is cancelled."""
        run = self.bus.local(run_id)
        if run is None or not run.parked or run_id in self._waking:
            return
        self._cancel_timer(run_id)
        if run.task is not None:  # its task is still stopping: wake it once it has
            self._wake_pending.add(run_id)
            return
        task = asyncio.create_task(self._wake(run), name=f"wake-{run_id}")
        self._waking[run_id] = task
        task.add_done_callback(lambda _: self._waking.pop(run_id, None))

    async def _wake(self, run: RunState) -> None:
        """Go on with parked `run` here, from its journal (as `resume` does, in its own log)."""
        assert self.journal is not None and self._journaling is not None
        run_id, chat_id = run.run_id, run.chat_id
        recorder = self._recorders[chat_id]
        try:
            await self._journaling.flush()  # the answers it was given are journaled
            journaled = await self.journal.load(run_id)
            if journaled is None:
                raise LookupError("its journal is gone")
            record = journaled.record
            command = QueryCommand.from_record(record["command"])
            agent = AgentDefinition.model_validate(
                record["agent"], context={"key": record["agentKey"]}
            ).in_mode(record["mode"])
            try:
                records = await self.chats.read(chat_id)
            except ChatNotFound:
                records = []
        except Exception as error:
            log.exception("could not wake parked run %s", run_id)
            failed = events.run_error("INTERNAL", f"the parked run could not go on ({error})")
            self._end_parked(run, recorder, failed, "")
            return
        if run.cancel_reason:  # cancelled while parked: it ends without running again
            self._end_parked(run, recorder, events.run_cancel(run.cancel_reason), agent.mode)
            return
        journaling = self._journaling
        attempt = journaled.attempts + 1
        replay = Replay(journaled)
        run.log.steps = RunSteps(run_id, journaling, replay)
        run.log.replay = replay
        journaling.submit(JournalEntry(run_id, "resume", str(attempt), attempt=attempt))
        options = self.options
        run.accounting = Accounting(currency=options.currency, pricing=options.pricing)
        recorder.follow_turns()
        memory = remembered([r for r in records if r.get("runId") != run_id], options.memory_runs)
        run.parked, run.waker = False, None
        self._active.add(run)
        mode, models = self.modes[agent.mode], bind_stages(self.services.models, agent)
        self._execute(run, recorder, command, agent, mode, models, memory, record["parts"])
        log.info("run %s woken (attempt %d)", run_id, attempt)

    def _end_parked(
        self, run: RunState, recorder: ChatRecorder, terminal: events.Event, mode: str
    ) -> None:
        """End parked `run` with `terminal`, without running it again."""
        self.services.waits.close(run.run_id)
        run.parked, run.waker = False, None
        run.log.finish(terminal)
        self._ended(run, recorder, mode)

    def _cancel_timer(self, run_id: str) -> None:
        timer = self._timers.pop(run_id, None)
        if timer is not None:
            timer.cancel()

    # -- drain -------------------------------------------------------------------------

    async def drain(self, grace_s: float, delay_s: float = 0.0) -> None:
        """Refuse new runs; hand over, after `delay_s`, the runs another replica can go on
        with at once (journaled runs of agents that resume, and parked runs, when the bus
        says a replica not draining is up); let the others finish within `grace_s`, then
        hand them over too (journaled runs: they stop without ending, to resume in another
        process or after the restart) or cancel them. Parked runs that nobody takes over at
        once stay parked, in the journal."""
        self.draining = True
        started = time.monotonic()
        await self.bus.drain()  # and this replica takes no run over from now on
        active = list(self._active)
        movable = [r for r in active if self._movable(r)]
        parked = self._parked()
        if active:
            log.info(
                "draining %d active runs (%d may be handed over after %.1fs, grace %.1fs)",
                len(active),
                len(movable),
                min(delay_s, grace_s),
                grace_s,
            )
        if movable or parked:
            delay = min(delay_s, grace_s) - (time.monotonic() - started)
            if movable:
                await _until_ended(movable, delay)
            elif delay > 0:
                await asyncio.sleep(delay)
            movable = [r for r in self._active if self._movable(r)]  # and ones resumed here
            parked = self._parked()
            if (movable or parked) and await self.bus.can_hand_over():
                log.info(
                    "handing %d runs over to other replicas (%d parked)",
                    len(movable) + len(parked),
                    len(parked),
                )
                for run in movable:
                    self._suspend(run)
                for run in parked:
                    self._hand_over_parked(run)
        rest = [r for r in self._active if not (r.done or r.cancel_reason)]
        await _until_ended(rest, grace_s - (time.monotonic() - started))
        journaled = self._journaling is not None and not self._journaling.failed
        for run in list(self._active):
            if run.cancel_reason:
                continue  # handed over already
            if journaled and run.log.steps is not None:
                self._suspend(run)
            else:
                run.cancel("shutdown")
        for run_id in list(self._timers):  # parked runs stay parked, in the journal
            self._cancel_timer(run_id)
        if self._waking:
            await asyncio.wait(list(self._waking.values()), timeout=5.0)
        remaining = [r.task for r in self._active if r.task is not None]
        if remaining:
            await asyncio.wait(remaining, timeout=5.0)
        await self.flush()

    @staticmethod
    def _suspend(run: RunState) -> None:
        """Stop `run` without an end, to go on elsewhere: its journal says so (`DRAIN`: not a
        lost owner); once its task has stopped the bus hands it over (`_ended`)."""
        if run.log.steps is not None:
            run.log.steps.hand_over(DRAIN)
        run.hand_over()

    def _parked(self) -> list[RunState]:
        """The parked runs that can be handed over now (none waking, none ending)."""
        return [
            run
            for run in self.bus.local_runs().values()
            if run.parked
            and not run.done
            and run.task is None
            and not run.cancel_reason
            and run.run_id not in self._waking
            and run.run_id not in self._wake_pending
        ]

    def _hand_over_parked(self, run: RunState) -> None:
        """Give parked `run` to another replica: it parks it again there at once (its journal
        says it was parked); a reader here gets RUN_HANDED_OVER and re-attaches."""
        self._cancel_timer(run.run_id)
        run.parked, run.waker = False, None
        log.info("run %s handed over", run.run_id)
        run.log.hand_over()
        self._track(self._hand_over(run), f"hand-over-{run.run_id}")

    def _movable(self, run: RunState) -> bool:
        """Whether `run` can be handed over to go on elsewhere: journaled, of an agent that
        resumes, still running."""
        journaling = self._journaling
        return (
            journaling is not None
            and not journaling.failed
            and run.log.steps is not None
            and run.resumable
            and not run.done
            and not run.cancel_reason
        )

    async def flush(self) -> None:
        """Wait until every ended run is recorded and kept in the run log, every handed over
        run given to the bus, and the journal has everything."""
        while self._finishing:
            await asyncio.wait(list(self._finishing), timeout=10.0)
        if self._journaling is not None:
            await self._journaling.flush()


def _after_first_step(callback: Callable[..., None], *args: Any) -> None:
    """Call `callback(*args)` once the task created just before has made its first step,
    and what that step started has made its own.

    A run's task is created just before this: on the loop's next turn it makes its
    first step — up to its first model request, which it hands to the HTTP client and
    then waits for the answer — and the HTTP client (aiohttp) writes the request's body
    in a task of its own, created in that step. The callback comes after both.
    """
    loop = asyncio.get_running_loop()
    loop.call_soon(loop.call_soon, callback, *args)


class _TaskEnd:
    """What a run's task calls once done: the lifecycle's `_ended` for the run. An object
    rather than a closure (its function, its cells), held for as long as the run runs."""

    __slots__ = ("lifecycle", "mode", "recorder", "run")

    def __init__(
        self, lifecycle: RunLifecycle, run: RunState, recorder: ChatRecorder, mode: str
    ) -> None:
        self.lifecycle = lifecycle
        self.run = run
        self.recorder = recorder
        self.mode = mode

    def __call__(self, _task: asyncio.Task[None]) -> None:
        self.lifecycle._ended(self.run, self.recorder, self.mode)


async def _until_ended(runs: list[RunState], timeout_s: float) -> None:
    """Wait until every one of `runs` has emitted its terminal event, at most `timeout_s`."""
    if not runs or timeout_s <= 0:
        return
    waiters = [asyncio.ensure_future(run.wait()) for run in runs]
    _, pending = await asyncio.wait(waiters, timeout=timeout_s)
    for waiter in pending:
        waiter.cancel()


def _log_run_end(run: RunState, mode: str) -> None:
    """One INFO line per run: who ran what, how it ended, how long, what it used.

    The outcome is `complete`, `error` or `cancel`, with the finish reason, the error's
    reason or the cancel reason; never a message or any of the run's content.
    """
    terminal = run.terminal
    field = terminal.WhichOneof("payload") if terminal is not None else None
    if field == "run_complete" and terminal is not None:
        outcome, reason = "complete", terminal.run_complete.finish_reason
    elif field == "run_error" and terminal is not None:
        outcome, reason = "error", terminal.run_error.error.reason
    else:
        outcome = "cancel"
        reason = terminal.run_cancel.reason if terminal is not None else run.cancel_reason
    usage = run.accounting.usage
    fields = {
        "run_id": run.run_id,
        "chat_id": run.chat_id,
        "agent": run.agent_key,
        "mode": mode,
        "outcome": outcome,
        "reason": reason,
        "duration_ms": round((time.monotonic() - run.started_at) * 1000, 1),
        "model_calls": run.accounting.model_calls,
        "tokens_in": usage.prompt_tokens if usage is not None else 0,
        "tokens_out": usage.completion_tokens if usage is not None else 0,
    }
    log.info(
        "run %(run_id)s ended: %(outcome)s (%(reason)s); chat %(chat_id)s, agent %(agent)s, "
        "%(mode)s, %(duration_ms).1f ms, %(model_calls)d model call%(calls_s)s, "
        "%(tokens_in)d tokens in, %(tokens_out)d out",
        {**fields, "calls_s": "" if fields["model_calls"] == 1 else "s"},
        extra=fields,
    )
