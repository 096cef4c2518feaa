"""The runtime: starts runs, finds them, cancels them, drains them on shutdown.

This is the core's front door; the transports call it and nothing else.
Failures before a run exists are raised as `AgwError`s (the transport turns
them into statuses); once `query` returns, every outcome is an event.

Per chat, at most one run is active. A query on a busy chat follows its
multitask strategy (the request's, else the server's): reject it, enqueue it
until the active run ends, or interrupt the active run. A run outlives the
client that started it (by default): it can be re-joined with `attach` while
it runs, for `retention_s` after it ended from memory, then from the archive.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import uuid
import weakref
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Literal

from agw.v1 import gateway_pb2 as gw
from google.protobuf import json_format

from service.core import events
from service.core.agent_registry import AgentRegistry
from service.core.agents import AgentDefinition
from service.core.archive import RunArchive
from service.core.chats import ChatStore, chat_name_of
from service.core.errors import ChatBusy, InvalidRequest, Overloaded, RunNotFound, ShuttingDown
from service.core.jsonl_store import check_chat_id
from service.core.memory import conversation, estimate_tokens, fit
from service.core.middleware import hooks
from service.core.modes.oneshot import run_oneshot
from service.core.modes.plan_execute import run_plan_execute
from service.core.modes.react import run_react
from service.core.observe import Pricing
from service.core.recorder import ChatRecorder, user_message
from service.core.run import Run
from service.core.runner import Mode, ModelRouter, RunContext, execute, resolve_model
from service.core.tools.registry import ToolRegistry
from service.core.turn import Ids
from service.core.uploads import UploadStore
from service.core.waits import SubmitResult, Waits

log = logging.getLogger("agw.runtime")

MODES: dict[str, Mode] = {
    "ONESHOT": run_oneshot,
    "REACT": run_react,
    "PLAN_EXECUTE": run_plan_execute,
}

Strategy = Literal["reject", "enqueue", "interrupt"]
STRATEGIES: dict[int, Strategy] = {
    gw.MULTITASK_STRATEGY_REJECT: "reject",
    gw.MULTITASK_STRATEGY_ENQUEUE: "enqueue",
    gw.MULTITASK_STRATEGY_INTERRUPT: "interrupt",
}


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    max_active_runs: int = 1000
    memory_runs: int = 20
    multitask_strategy: Strategy = "reject"
    unwatched_run_ttl_s: float = 600.0
    retention_s: float = 60.0
    image_input: Any = None  # callable(provider key) -> bool; None: never
    inline_text_bytes: int = 32 * 1024
    middlewares: tuple[object, ...] = ()
    pricing: Pricing | None = None
    context_max_tokens: int = 0  # budget of the chat memory given to the model; 0: no limit
    currency: str = "USD"
    debug_level: int = gw.DEBUG_LEVEL_OFF  # when the request does not choose one


class Runtime:
    """Starts and tracks the runs of the loaded agents."""

    def __init__(
        self,
        agents: AgentRegistry,
        models: ModelRouter,
        store: ChatStore,
        archive: RunArchive,
        uploads: UploadStore,
        options: RuntimeOptions = RuntimeOptions(),
        *,
        tools: ToolRegistry | None = None,
        waits: Waits | None = None,
    ) -> None:
        self.agents = agents
        self.tools = tools if tools is not None else ToolRegistry()
        self.waits = waits if waits is not None else Waits()
        self.models = models
        self.store = store
        self.archive = archive
        self.uploads = uploads
        self.options = options
        self.runs: dict[str, Run] = {}
        self.draining = False
        self._active: set[Run] = set()
        self._chat_runs: dict[str, Run] = {}
        self._recorders: dict[str, ChatRecorder] = {}  # the latest recorder of each chat
        self._starting: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._finishing: set[asyncio.Task[None]] = set()

    @property
    def active_runs(self) -> int:
        return len(self._active)

    async def query(self, request: gw.QueryRequest) -> Run:
        """Validate `request`, start its run, and return the run (already streaming)."""
        self._check_accepting()
        if not request.agent_key:
            raise InvalidRequest("agentKey is required")
        if not request.message.strip():
            raise InvalidRequest("message is required")
        if request.chat_id:
            check_chat_id(request.chat_id)
        agent = self.agents.get(request.agent_key)
        mode = MODES.get(agent.mode)
        if mode is None:
            raise InvalidRequest(f"agent {agent.key!r}: mode {agent.mode} is not available")
        for stage in agent.stage_names:  # fail fast on an unknown provider or model
            resolve_model(self.models, agent.stage(stage), [])
            self.tools.for_stage(agent.stage(stage), agent.tool_policy)  # and on unknown tools
        chat_id = request.chat_id or str(uuid.uuid4())
        lock = self._starting.setdefault(chat_id, asyncio.Lock())
        async with lock:  # one query at a time gets through the start of a chat's run
            return await self._start(request, agent, mode, chat_id)

    async def _start(
        self, request: gw.QueryRequest, agent: AgentDefinition, mode: Mode, chat_id: str
    ) -> Run:
        await self._wait_for_chat(chat_id, STRATEGIES.get(request.multitask_strategy))
        self._check_accepting()
        previous = self._recorders.get(chat_id)
        if previous is not None:  # the chat's last run must be fully written before we read it
            await previous.closed()
        new_chat = self.store.summary(chat_id) is None
        history = (
            []
            if new_chat
            else conversation(await self.store.read(chat_id), self.options.memory_runs)
        )
        provider = agent.stage(agent.stage_names[0]).model.provider_key or self.models.default_key
        parts = await self._reference_parts(request, provider)

        run = Run(secrets.token_hex(8), chat_id, agent.key, self.options.middlewares)
        run.debug_level = request.debug_level or self.options.debug_level
        run.pricing, run.currency = self.options.pricing, self.options.currency
        for on_run_start in hooks(self.options.middlewares, "on_run_start"):
            on_run_start(run)
        self.runs[run.run_id] = run
        self._chat_runs[chat_id] = run
        self._active.add(run)
        query_event = events.request_query(
            request.request_id or str(uuid.uuid4()),
            request.role or "user",
            request.message,
            agent.key,
            references=request.references,
            params=request.params if request.HasField("params") else None,
            scene=request.scene if request.HasField("scene") else None,
            stream=request.stream if request.HasField("stream") else True,
        )
        query_record = json_format.MessageToDict(query_event.request_query)
        query_record["chatId"] = chat_id
        stored_user = user_message(request.message, parts)
        recorder = ChatRecorder(self.store, run, query_record, stored_user, agent.stage_names[0])
        self._recorders[chat_id] = recorder
        run.emit(query_event)
        if new_chat:
            run.emit(events.chat_start(chat_name_of(request.message)))
        run.emit(events.run_start(agent.key))
        if self.options.context_max_tokens:
            history = self._fit_context(run, history)
        model_user: dict[str, Any] = {"role": request.role or "user", "content": request.message}
        if parts:
            model_user["content"] = [{"type": "text", "text": request.message}, *parts]
        context = RunContext(
            run,
            agent,
            request,
            self.models,
            Ids(run.run_id),
            history,
            model_user,
            tools=self.tools,
            waits=self.waits,
        )
        run.on_unwatched = self._arm_unwatched_timer
        run.task = asyncio.create_task(execute(context, mode), name=f"run-{run.run_id}")
        run.task.add_done_callback(lambda _: self._ended(run, recorder))
        return run

    def _fit_context(self, run: Run, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Drop the oldest turns of the chat's memory that exceed the context budget."""
        fitted = fit(history, self.options.context_max_tokens)
        if len(fitted) < len(history):
            run.emit(
                events.context_compress(
                    "truncate",
                    len(history),
                    len(fitted),
                    estimate_tokens(history),
                    estimate_tokens(fitted),
                )
            )
        return fitted

    def _check_accepting(self) -> None:
        if self.draining:
            raise ShuttingDown("the service is shutting down; retry on another instance")
        if len(self._active) >= self.options.max_active_runs:
            raise Overloaded(f"too many active runs ({self.options.max_active_runs}); retry later")

    async def _wait_for_chat(self, chat_id: str, strategy: Strategy | None) -> None:
        strategy = strategy or self.options.multitask_strategy
        while (active := self._chat_runs.get(chat_id)) is not None:
            if strategy == "reject":
                raise ChatBusy(
                    f"chat {chat_id!r} has an active run {active.run_id!r}; wait for it to end, "
                    "cancel it, or query with multitaskStrategy ENQUEUE or INTERRUPT",
                    chat_id=chat_id,
                    run_id=active.run_id,
                )
            if strategy == "interrupt":
                active.cancel("interrupt")
            await active.wait()
            await asyncio.sleep(0)  # let the ended run release the chat

    async def _reference_parts(self, request: gw.QueryRequest, provider: str) -> list[Any]:
        image_input = bool(self.options.image_input and self.options.image_input(provider))
        parts: list[Any] = []
        for reference in request.references:
            if reference.id:
                parts += await self.uploads.content_parts(
                    reference.id,
                    image_input=image_input,
                    inline_text_bytes=self.options.inline_text_bytes,
                )
            elif reference.url:
                parts.append({"type": "text", "text": f"[reference {reference.url}]"})
        return parts

    def get_run(self, run_id: str) -> Run:
        run = self.runs.get(run_id)
        if run is None:
            raise RunNotFound(f"no active or recent run {run_id!r}", run_id=run_id)
        return run

    async def attach(self, run_id: str, after_seq: int) -> AsyncGenerator[events.Event, None]:
        """The run's events after `after_seq`: from memory (live or recent), else the archive."""
        if after_seq < 0:
            raise InvalidRequest("afterSeq must be >= 0")
        run = self.runs.get(run_id)
        if run is not None:
            return run.follow(after_seq)
        archived = await self.archive.load(run_id)
        if archived is None:
            raise RunNotFound(f"no run {run_id!r} (unknown or expired)", run_id=run_id)

        async def replay() -> AsyncGenerator[events.Event, None]:
            for event in archived[after_seq:]:
                yield event

        return replay()

    def submit(self, request: gw.SubmitRequest) -> SubmitResult:
        """Deliver a user's answer to a waiting frontend tool of a run."""
        if not request.run_id:
            raise InvalidRequest("runId is required")
        run = self.runs.get(request.run_id)
        if run is not None and request.chat_id and request.chat_id != run.chat_id:
            run = None  # not a run of that chat
        return self.waits.submit(
            run,
            request.tool_id,
            request.payload,
            request_id=request.request_id,
            view_id=request.view_id,
        )

    def cancel(self, run_id: str, reason: str = "cancel") -> bool:
        """Stop a running run; False when it had already ended."""
        return self.get_run(run_id).cancel(reason)

    def _arm_unwatched_timer(self, run: Run) -> None:
        def expire() -> None:
            if run.subscribers == 0 and not run.done:
                log.info(
                    "run %s had no watcher for %.0fs; cancelling",
                    run.run_id,
                    self.options.unwatched_run_ttl_s,
                )
                run.cancel("abandoned")

        asyncio.get_running_loop().call_later(self.options.unwatched_run_ttl_s, expire)

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

    async def flush(self) -> None:
        """Wait until every ended run is recorded and archived."""
        while self._finishing:
            await asyncio.wait(list(self._finishing), timeout=10.0)

    def _ended(self, run: Run, recorder: ChatRecorder) -> None:
        self._active.discard(run)
        for on_run_end in hooks(self.options.middlewares, "on_run_end"):
            try:
                on_run_end(run, run.terminal)
            except Exception:
                log.exception("middleware on_run_end failed for run %s", run.run_id)
        if self._chat_runs.get(run.chat_id) is run:
            del self._chat_runs[run.chat_id]
        task = asyncio.create_task(self._archive(run, recorder), name=f"archive-{run.run_id}")
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def _archive(self, run: Run, recorder: ChatRecorder) -> None:
        try:
            await recorder.closed()
            if self._recorders.get(run.chat_id) is recorder:
                del self._recorders[run.chat_id]
            await self.archive.save(run.run_id, run.log)
        except Exception:
            log.exception("could not archive run %s", run.run_id)
        asyncio.get_running_loop().call_later(self.options.retention_s, self._forget, run.run_id)

    def _forget(self, run_id: str) -> None:
        self.runs.pop(run_id, None)
        self.waits.forget(run_id)
