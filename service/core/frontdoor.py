"""The core's front door: starts runs, finds them, answers and cancels them, shows chats.

The transports decode their requests into core commands and call this and
nothing else; this talks to the state ports (`ChatStore`, `RunLog`, `RunBus`)
and never to a concrete store. Failures before a run exists are raised as
`AgwError`s (the transport turns them into statuses); once `query` returns,
every outcome is an event of the run.

Per chat, at most one run is active. A query on a busy chat follows its
multitask strategy (the query's, else the service's): reject it, enqueue it
until the active run ends, or interrupt the active run. A run outlives the
client that started it (by default): it can be re-joined with `attach` while
it runs, for `retention_s` after it ended from memory, then from the run log.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import secrets
import time
import uuid
import weakref
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any

from service.core import events
from service.core.agent_registry import AgentRegistry
from service.core.agents import AgentDefinition
from service.core.commands import (
    ANONYMOUS,
    ChatView,
    DebugLevel,
    Principal,
    QueryCommand,
    Strategy,
    SubmitCommand,
    SubmitResult,
    UploadCommand,
)
from service.core.errors import (
    BusUnavailable,
    ChatBusy,
    ChatNotFound,
    InvalidRequest,
    Overloaded,
    PayloadTooLarge,
    RunNotFound,
    ShuttingDown,
)
from service.core.eventlog import EventLog
from service.core.history import replay
from service.core.ids import chat_name_of, check_chat_id, shorten, valid_run_id
from service.core.memory import Turn, estimate_tokens, fit, flatten, remembered
from service.core.middleware import hooks
from service.core.modes import MODES
from service.core.observe import Pricing
from service.core.ports import ChatStore, ChatSummary, RunBus, RunLog, RunRef
from service.core.recorder import ChatRecorder, user_message
from service.core.runner import Mode, ModelRouter, RunContext, execute, resolve_model
from service.core.runstate import Accounting, RunState
from service.core.skills import SkillRegistry
from service.core.subagents import Subagents
from service.core.tools.registry import ToolRegistry
from service.core.turn import Ids
from service.core.uploads import StoredUpload, Uploads

log = logging.getLogger("agw.runtime")

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A run ready to be registered, and what its start needs."""

    run: RunState
    query_event: events.Event
    query_record: dict[str, Any]
    new_chat: bool
    memory: list[Turn]
    parts: list[Any]


@dataclass(frozen=True, slots=True)
class FrontDoorOptions:
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
    context_length: int = 32_768  # a model's context length when nothing else says (context.py)
    currency: str = "USD"
    debug_level: DebugLevel = DebugLevel.OFF  # when the query does not choose one


class FrontDoor:
    """Starts and tracks the runs of the loaded agents."""

    def __init__(
        self,
        agents: AgentRegistry,
        models: ModelRouter,
        *,
        chats: ChatStore,
        run_log: RunLog,
        bus: RunBus,
        uploads: Uploads,
        tools: ToolRegistry | None = None,
        skills: SkillRegistry | None = None,
        options: FrontDoorOptions = FrontDoorOptions(),
    ) -> None:
        self.agents = agents
        self.models = models
        self.chats = chats
        self.run_log = run_log
        self.bus = bus
        self.uploads = uploads
        self.tools = tools if tools is not None else ToolRegistry()
        self.skills = skills
        self.subagents = Subagents(agents)
        self.options = options
        self.draining = False
        self._active: set[RunState] = set()  # the runs this process executes
        self._recorders: dict[str, ChatRecorder] = {}  # the latest recorder of each chat
        self._starting: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._finishing: set[asyncio.Task[None]] = set()

    @property
    def active_runs(self) -> int:
        return len(self._active)

    # -- agents ------------------------------------------------------------------------

    def list_agents(self) -> builtins.list[AgentDefinition]:
        return self.agents.list()

    def get_agent(self, agent_key: str) -> AgentDefinition:
        if not agent_key:
            raise InvalidRequest("agentKey is required")
        return self.agents.get(agent_key)

    # -- runs --------------------------------------------------------------------------

    async def query(self, command: QueryCommand) -> RunState:
        """Validate `command`, start its run, and return the run (already streaming)."""
        self._check_accepting()
        if not command.agent_key:
            raise InvalidRequest("agentKey is required")
        if not command.message.strip():
            raise InvalidRequest("message is required")
        if (size := len(command.message.encode())) > (limit := self.options.max_message_bytes):
            raise PayloadTooLarge(f"message is {size} bytes; the limit is {limit} bytes")
        if command.chat_id:
            check_chat_id(command.chat_id)
        agent = self.agents.get(command.agent_key)
        if command.mode is not None:  # the query chooses among the agent's modes
            agent = agent.in_mode(command.mode)
        mode = MODES.get(agent.mode)
        if mode is None:
            raise InvalidRequest(f"agent {agent.key!r}: mode {agent.mode} is not available")
        for stage in agent.stage_names:  # fail fast on an unknown provider or model
            resolve_model(self.models, agent.stage(stage), [])
            self.tools.for_stage(agent.stage(stage), agent.tool_policy)  # and on unknown tools
        self.subagents.check(agent)  # and on unknown subagents, cycles, too deep a nesting
        if command.chat_id:
            await self._check_chat_owner(command.chat_id, command.principal)
        chat_id = command.chat_id or str(uuid.uuid4())
        lock = self._starting.setdefault(chat_id, asyncio.Lock())
        async with lock:  # one query at a time gets through the start of a chat's run
            return await self._start(command, agent, mode, chat_id)

    async def _start(
        self, command: QueryCommand, agent: AgentDefinition, mode: Mode, chat_id: str
    ) -> RunState:
        while True:
            await self._wait_for_chat(chat_id, command.strategy)
            prepared = await self._prepare(command, agent, chat_id)
            run = prepared.run
            clash = await self.bus.register(run)
            if clash is None:
                break
            # another process started a run on the chat in the meantime
            await self._meet(clash, chat_id, command.strategy)
        try:
            return self._launch(prepared, command, agent, mode)
        except BaseException:
            await self.bus.ended(run)
            await self.bus.settled(run)
            await self.bus.release(run.run_id)
            raise

    async def _prepare(
        self, command: QueryCommand, agent: AgentDefinition, chat_id: str
    ) -> _Prepared:
        """Everything a run needs before it is registered (what may fail, fails here)."""
        self._check_accepting()
        previous = self._recorders.get(chat_id)
        if previous is not None:  # the chat's last run must be fully written before we read it
            await previous.closed()
        await self.bus.wait_settled(chat_id)  # also when it ran in another process
        new_chat = await self.chats.summary(chat_id) is None
        memory = (
            [] if new_chat else remembered(await self.chats.read(chat_id), self.options.memory_runs)
        )
        provider = agent.stage(agent.stage_names[0]).model.provider_key or self.models.default_key
        parts = await self._reference_parts(command, provider)
        query_event = events.request_query(command, command.request_id or str(uuid.uuid4()))
        query_record = events.to_dict(query_event.request_query)
        query_record["chatId"] = chat_id
        owner = command.principal

        options = self.options
        run = RunState(
            EventLog(secrets.token_hex(8), chat_id, options.middlewares),
            agent.key,
            debug_level=(
                options.debug_level if command.debug_level is None else command.debug_level
            ),
            accounting=Accounting(currency=options.currency, pricing=options.pricing),
            owner=owner,
        )
        return _Prepared(run, query_event, query_record, new_chat, memory, parts)

    def _launch(
        self, start: _Prepared, command: QueryCommand, agent: AgentDefinition, mode: Mode
    ) -> RunState:
        """Start the registered run: its first events, its recorder, its task."""
        run = start.run
        options = self.options
        for on_run_start in hooks(options.middlewares, "on_run_start"):
            on_run_start(run)
        self._active.add(run)
        recorder = ChatRecorder(
            self.chats,
            run,
            start.query_record,
            user_message(command.message, start.parts),
            agent.stage_names[0],
            owner=run.owner,
        )
        self._recorders[run.chat_id] = recorder
        out = run.log.scope()
        out.emit(start.query_event)
        if start.new_chat:
            out.emit(events.chat_start(chat_name_of(command.message)))
        out.emit(events.run_start(agent.key))
        memory = start.memory
        if options.context_max_tokens:
            memory = self._fit_context(run.log, memory)
        history = flatten(memory)
        model_user: dict[str, Any] = {"role": command.role or "user", "content": command.message}
        if start.parts:
            model_user["content"] = [{"type": "text", "text": command.message}, *start.parts]
        context = RunContext(
            run,
            out,
            agent,
            command,
            self.models,
            self.bus,
            Ids(run.run_id),
            history,
            model_user,
            tools=self.tools,
            subagents=self.subagents,
            skills=self.skills,
            memory=memory,
            context_length=options.context_length,
        )
        run.log.on_unwatched = lambda _log: self._arm_unwatched_timer(run)
        run.task = asyncio.create_task(execute(context, mode), name=f"run-{run.run_id}")
        run.task.add_done_callback(lambda _: self._ended(run, recorder, agent.mode))
        return run

    async def _check_chat_owner(self, chat_id: str, principal: Principal) -> None:
        """A chat of another principal is, to this one, a chat that does not exist."""
        summary = await self.chats.summary(chat_id)
        active = await self.bus.active_of(chat_id)
        owner = summary.owner if summary is not None else active.owner if active else principal
        if owner != principal:
            raise ChatNotFound(f"no chat {chat_id!r}", chat_id=chat_id)

    def _fit_context(self, log: EventLog, memory: list[Turn]) -> list[Turn]:
        """Drop the oldest turns of the chat's memory that exceed the context budget."""
        history = flatten(memory)
        fitted = fit(history, self.options.context_max_tokens)
        dropped = len(history) - len(fitted)
        kept = memory
        while kept and dropped > 0:  # whole turns: `fit` cuts where a user message begins
            first, kept = kept[0], kept[1:]
            dropped -= len(first.messages)
            if dropped < 0:  # a turn cut in its middle: its rest stays
                kept = [Turn(first.run_id, first.messages[dropped:], first.through), *kept]
        if len(fitted) < len(history):
            log.emit(
                events.context_compress(
                    "truncate",
                    len(history),
                    len(fitted),
                    estimate_tokens(history),
                    estimate_tokens(fitted),
                )
            )
        return kept

    def _check_accepting(self) -> None:
        if self.draining:
            raise ShuttingDown("the service is shutting down; retry on another instance")
        limit = self.options.max_active_runs
        if len(self._active) >= limit:
            raise Overloaded(
                f"too many active runs: {len(self._active)} of the {limit} that fit are running; "
                "retry later",
                limit=str(limit),
            )

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

    @property
    def runs(self) -> Mapping[str, RunState]:
        """The runs live or recently ended in this process, by id."""
        return self.bus.local_runs()

    def get_run(self, run_id: str, principal: Principal = ANONYMOUS) -> RunState:
        """The live (or recently ended) run `run_id` of this process, if `principal`'s."""
        run = self.bus.local(run_id)
        if run is None or run.owner != principal:
            shown = shorten(run_id)
            raise RunNotFound(f"no active or recent run {shown!r}", run_id=shown)
        return run

    async def is_live(self, run_id: str, principal: Principal = ANONYMOUS) -> bool:
        """Whether `principal`'s run `run_id` is running now (its stream will go on)."""
        found = await self.bus.find(run_id) if valid_run_id(run_id) else None
        return found is not None and found.owner == principal and found.running

    async def attach(
        self, run_id: str, after_seq: int, principal: Principal = ANONYMOUS
    ) -> AsyncGenerator[events.Event, None]:
        """The run's events after `after_seq`: live or recent, else from the run log."""
        if after_seq < 0:
            raise InvalidRequest("afterSeq must be >= 0")
        if not run_id:
            raise InvalidRequest("runId is required")
        found = await self.bus.find(run_id) if valid_run_id(run_id) else None
        if found is not None and found.owner != principal:
            raise RunNotFound(f"no run {shorten(run_id)!r} (unknown or expired)")
        followed = await self.bus.follow(run_id, after_seq) if found is not None else None
        if followed is not None:
            return followed
        kept = await self.run_log.load(run_id) if valid_run_id(run_id) else None
        if kept and not await self._owns_chat(kept[0].chat_id, principal):
            kept = None
        if kept is None:
            shown = shorten(run_id)
            raise RunNotFound(f"no run {shown!r} (unknown or expired)", run_id=shown)

        async def replay_kept() -> AsyncGenerator[events.Event, None]:
            for event in kept[after_seq:]:
                yield event

        return replay_kept()

    async def submit(self, command: SubmitCommand) -> SubmitResult:
        """Deliver a user's answer to a waiting tool of a run."""
        return await self.bus.submit(command)

    async def cancel(
        self, run_id: str, principal: Principal = ANONYMOUS, reason: str = "cancel"
    ) -> bool:
        """Stop `principal`'s running run; False when it had already ended."""
        if not run_id:
            raise InvalidRequest("runId is required")
        found = await self.bus.find(run_id) if valid_run_id(run_id) else None
        cancelled = None
        if found is not None and found.owner == principal:
            cancelled = await self.bus.cancel(run_id, reason)
        if cancelled is None:
            shown = shorten(run_id)
            raise RunNotFound(f"no active or recent run {shown!r}", run_id=shown)
        return cancelled

    async def _owns_chat(self, chat_id: str, principal: Principal) -> bool:
        summary = await self.chats.summary(chat_id) if chat_id else None
        return (summary.owner if summary is not None else ANONYMOUS) == principal

    def _arm_unwatched_timer(self, run: RunState, *, waited: bool = False) -> None:
        """Cancel `run` once nobody has followed it for `unwatched_run_ttl_s`, unless it
        waits for a `Submit`: a client answering later (an A2A or AG-UI follow-up, a page
        reopened) finds it still waiting, bounded by the wait's own time-out, and has one
        more TTL after the answer to follow it again."""

        def expire() -> None:
            if run.log.subscribers or run.done:
                return
            waiting = bool(self.bus.waiting(run.run_id))
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

    # -- chats and uploads -------------------------------------------------------------

    async def list_chats(
        self, page_size: int = 0, page_token: str = "", principal: Principal = ANONYMOUS
    ) -> tuple[builtins.list[ChatSummary], str]:
        """A page of `principal`'s chats, newest first, and the next page's token."""
        if page_size < 0:
            raise InvalidRequest("pageSize must be >= 0")
        size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        return await self.chats.page(size, page_token, owner=principal)

    async def get_chat(
        self,
        chat_id: str,
        principal: Principal = ANONYMOUS,
        *,
        include_records: bool = False,
        history: bool = True,
    ) -> ChatView:
        """The chat's history as replayable events (and its raw records on request); without
        `history`, only its name and live run (its records are not read)."""
        if not chat_id:
            raise InvalidRequest("chatId is required")
        check_chat_id(chat_id)
        summary = await self.chats.summary(chat_id)
        try:
            live = await self.bus.live_of(chat_id)
        except BusUnavailable:  # the history is still there to read; the live run is not
            if summary is None:
                raise
            live = None
        owner = summary.owner if summary is not None else live.owner if live else principal
        if owner != principal:
            raise ChatNotFound(f"no chat {chat_id!r}", chat_id=chat_id)
        shown = live if live is not None and live.owner == principal else None
        chat_name = summary.chat_name if summary else ""
        if not history:
            if summary is None and live is None:
                raise ChatNotFound(f"no chat {chat_id!r}", chat_id=chat_id)
            return ChatView(live_run=shown, chat_id=chat_id, chat_name=chat_name)
        try:
            records = await self.chats.read(chat_id)
        except ChatNotFound:
            if live is None:
                raise
            records = []  # the chat's first run has not written its first record yet
        return ChatView(
            live_run=shown,
            chat_id=chat_id,
            chat_name=chat_name,
            events=replay(records),
            records=records if include_records else [],
            references=[
                ref
                for r in records
                if r.get("_type") == "query"
                for ref in (r.get("query") or {}).get("references") or []
            ],
        )

    async def upload(self, command: UploadCommand) -> StoredUpload:
        """Store an uploaded file that later queries can reference."""
        if command.chat_id:
            check_chat_id(command.chat_id)
            await self._check_chat_owner(command.chat_id, command.principal)
        return await self.uploads.save(
            command.name,
            command.content,
            command.mime_type,
            command.chat_id,
            owner=command.principal,
        )

    # -- lifecycle ---------------------------------------------------------------------

    async def open(self) -> None:
        """Prepare the stores and the bus before the first request."""
        await self.chats.open()
        await self.run_log.open()
        await self.uploads.open()
        await self.bus.open()

    async def drain(self, grace_s: float) -> None:
        """Refuse new runs, let running ones finish within `grace_s`, then cancel the rest."""
        self.draining = True
        active = list(self._active)
        if active:
            log.info("draining %d active runs (grace %.1fs)", len(active), grace_s)
            waiters = [asyncio.ensure_future(r.wait()) for r in active]
            _, pending = await asyncio.wait(waiters, timeout=grace_s)
            for waiter in pending:
                waiter.cancel()
        for run in list(self._active):
            run.cancel("shutdown")
        remaining = [r.task for r in self._active if r.task is not None]
        if remaining:
            await asyncio.wait(remaining, timeout=5.0)
        await self.flush()

    async def close(self) -> None:
        """Disconnect from the bus, after the drain."""
        await self.bus.close()

    async def flush(self) -> None:
        """Wait until every ended run is recorded and kept in the run log."""
        while self._finishing:
            await asyncio.wait(list(self._finishing), timeout=10.0)

    def _ended(self, run: RunState, recorder: ChatRecorder, mode: str) -> None:
        self._active.discard(run)
        _log_run_end(run, mode)
        for on_run_end in hooks(self.options.middlewares, "on_run_end"):
            try:
                on_run_end(run, run.terminal)
            except Exception:
                log.exception("middleware on_run_end failed for run %s", run.run_id)
        task = asyncio.create_task(self._keep(run, recorder), name=f"keep-{run.run_id}")
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def _keep(self, run: RunState, recorder: ChatRecorder) -> None:
        """After the run's end: free its chat, write its records, keep its log, forget it."""
        try:
            await self.bus.ended(run)
        except Exception:
            log.exception("could not mark run %s ended", run.run_id)
        try:
            await recorder.closed()
            if self._recorders.get(run.chat_id) is recorder:
                del self._recorders[run.chat_id]
            await self.bus.settled(run)
            if not run.fenced:  # a fenced run's log is kept by the replica that took it over
                await self.run_log.save(run.run_id, run.log)
        except Exception:
            log.exception("could not keep the log of run %s", run.run_id)
        asyncio.get_running_loop().call_later(self.options.retention_s, self._release, run.run_id)

    def _release(self, run_id: str) -> None:
        task = asyncio.create_task(self.bus.release(run_id), name=f"release-{run_id}")
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)


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
