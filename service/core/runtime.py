"""The runtime: starts runs, finds them, cancels them, drains them on shutdown.

This is the core's front door; the transports call it and nothing else.
Failures before a run exists are raised as `AgwError`s (the transport turns
them into statuses); once `query` returns, every outcome is an event.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from dataclasses import dataclass, field

from agw.v1 import gateway_pb2 as gw

from service.core import events
from service.core.agent_registry import AgentRegistry
from service.core.errors import InvalidRequest, Overloaded, RunNotFound, ShuttingDown
from service.core.modes.oneshot import run_oneshot
from service.core.run import Run
from service.core.runner import Mode, ModelRouter, RunContext, execute, resolve_model
from service.core.turn import Ids

log = logging.getLogger("agw.runtime")

MODES: dict[str, Mode] = {"ONESHOT": run_oneshot}
CHAT_NAME_LENGTH = 30


@dataclass(slots=True)
class ChatInfo:
    chat_id: str
    chat_name: str
    agent_key: str
    created_at: int
    updated_at: int
    run_ids: list[str] = field(default_factory=list)


def chat_name_of(message: str) -> str:
    """A chat's name: the start of its first query, on one line."""
    name = " ".join(message.split())
    return name if len(name) <= CHAT_NAME_LENGTH else name[: CHAT_NAME_LENGTH - 1] + "…"


class Runtime:
    """Starts and tracks the runs of the loaded agents."""

    def __init__(
        self,
        agents: AgentRegistry,
        models: ModelRouter,
        *,
        max_active_runs: int = 1000,
        retention_s: float = 300.0,
    ) -> None:
        self.agents = agents
        self.models = models
        self.max_active_runs = max_active_runs
        self.retention_s = retention_s
        self.runs: dict[str, Run] = {}
        self.chats: dict[str, ChatInfo] = {}
        self.draining = False
        self._active: set[Run] = set()

    @property
    def active_runs(self) -> int:
        return len(self._active)

    def query(self, request: gw.QueryRequest) -> Run:
        """Validate `request`, start its run, and return the run (already streaming)."""
        if self.draining:
            raise ShuttingDown("the service is shutting down; retry on another instance")
        if not request.agent_key:
            raise InvalidRequest("agentKey is required")
        if not request.message.strip():
            raise InvalidRequest("message is required")
        if len(self._active) >= self.max_active_runs:
            raise Overloaded(f"too many active runs ({self.max_active_runs}); retry later")
        agent = self.agents.get(request.agent_key)
        mode = MODES.get(agent.mode)
        if mode is None:
            raise InvalidRequest(f"agent {agent.key!r}: mode {agent.mode} is not available")
        for stage in agent.stage_names:  # fail fast on an unknown provider or model
            resolve_model(self.models, agent.stage(stage), [])

        now = time.time_ns() // 1_000_000
        chat = self.chats.get(request.chat_id) if request.chat_id else None
        new_chat = chat is None
        if chat is None:
            chat_id = request.chat_id or str(uuid.uuid4())
            chat = ChatInfo(chat_id, chat_name_of(request.message), agent.key, now, now)
            self.chats[chat_id] = chat
        run = Run(secrets.token_hex(8), chat.chat_id, agent.key)
        chat.run_ids.append(run.run_id)
        chat.updated_at = now
        self.runs[run.run_id] = run

        run.emit(
            events.request_query(
                request.request_id or str(uuid.uuid4()),
                request.role or "user",
                request.message,
                agent.key,
                references=request.references,
                params=request.params if request.HasField("params") else None,
                scene=request.scene if request.HasField("scene") else None,
                stream=request.stream if request.HasField("stream") else True,
            )
        )
        if new_chat:
            run.emit(events.chat_start(chat.chat_name))
        run.emit(events.run_start(agent.key))
        context = RunContext(run, agent, request, self.models, Ids(run.run_id))
        run.task = asyncio.create_task(execute(context, mode), name=f"run-{run.run_id}")
        self._active.add(run)
        run.task.add_done_callback(lambda _: self._ended(run))
        return run

    def get_run(self, run_id: str) -> Run:
        run = self.runs.get(run_id)
        if run is None:
            raise RunNotFound(f"no run {run_id!r} (unknown or expired)", run_id=run_id)
        return run

    def cancel(self, run_id: str, reason: str = "cancel") -> bool:
        """Stop a running run; False when it had already ended."""
        return self.get_run(run_id).cancel(reason)

    async def drain(self, grace_s: float) -> None:
        """Refuse new runs, let running ones finish within `grace_s`, then cancel the rest."""
        self.draining = True
        active = list(self._active)
        if active:
            log.info("draining %d active runs (grace %.1fs)", len(active), grace_s)
            _, pending = await asyncio.wait(
                [asyncio.ensure_future(r.wait()) for r in active], timeout=grace_s
            )
            for waiter in pending:
                waiter.cancel()
        for run in list(self._active):
            run.cancel("shutdown")
        remaining = [r.task for r in self._active if r.task is not None]
        if remaining:
            await asyncio.wait(remaining, timeout=5.0)

    def _ended(self, run: Run) -> None:
        self._active.discard(run)
        loop = asyncio.get_running_loop()
        loop.call_later(self.retention_s, self.runs.pop, run.run_id, None)
