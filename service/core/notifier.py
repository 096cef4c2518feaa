"""Tells a run's webhooks what becomes of it: a notice per change of its A2A task state.

The notifier watches every run (a middleware of the runs: `on_run_start` observes its
events, `on_run_end` takes its terminal event, also when a resumed run's journal already
held it). From the run's events it reads the states an A2A task goes through: `working`
(`run.start`, and `request.submit` when the run goes on after an answer),
`input-required` (a frontend tool's `tool.end`, `question.ask`, `permission.ask`,
`plan.approval`), then `completed`, `failed` or `canceled`. Each change is a `Notice`;
for each webhook of the run that wants it (the `agw` form wants the end only) a `Delivery`
is queued in the `WebhookStore`, in the order of the run's events, and the sender is
woken (`wake`). A nested run's (a subagent's) events are the caller's business.

Each run's notices are queued one after the other, so that its webhooks get them in
order (runs do not wait for each other); a store that fails is logged and the run goes
on (its notice is lost, never the run).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence

from service.core.events import Event
from service.core.run.state import RunState
from service.core.webhooks import TERMINAL_STATES, Delivery, Notice, State, Webhook, WebhookStore

log = logging.getLogger("agw.webhooks")

#: The terminal event's kind → the task's last state.
END_STATES: dict[str, State] = {
    "run_complete": "completed",
    "run_error": "failed",
    "run_cancel": "canceled",
}
_ASKS = frozenset({"question_ask", "permission_ask", "plan_approval"})
_SERVICE_TOOL_TYPES = frozenset({"", "backend"})


class Notifier:
    """Queues the notices of the runs for their webhooks."""

    def __init__(
        self,
        store: WebhookStore,
        *,
        service_webhooks: Sequence[Webhook] = (),
        agent_webhooks: Callable[[str], Sequence[Webhook]] = lambda _key: (),
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.store = store
        self.service_webhooks = tuple(service_webhooks)
        self.agent_webhooks = agent_webhooks
        self.wake = wake
        self._queues: dict[str, deque[Notice]] = {}  # per run, the notices not queued yet
        self._workers: dict[str, asyncio.Task[None]] = {}

    # -- the runs (as a middleware: service/core/middleware.py) -----------------------

    def on_run_start(self, run: RunState) -> None:
        run.log.observe(_Watch(self, run))

    def on_run_end(self, run: RunState, terminal: Event | None) -> None:
        state = END_STATES.get(terminal.WhichOneof("payload") or "") if terminal else None
        if terminal is not None and state is not None:
            self.post(run, terminal, state)

    # -- notices ----------------------------------------------------------------------

    def post(self, run: RunState, event: Event, state: State) -> None:
        """Queue the notice that `run` is in `state` now, as `event` says."""
        notice = Notice(
            run.run_id,
            run.chat_id,
            run.agent_key,
            event.seq,
            state,
            event.SerializeToString(),
            event.timestamp,
        )
        self._queues.setdefault(run.run_id, deque()).append(notice)
        if run.run_id not in self._workers:
            self._workers[run.run_id] = asyncio.get_running_loop().create_task(
                self._work(run.run_id), name=f"webhook-notices-{run.run_id}"
            )

    async def _work(self, run_id: str) -> None:
        queue = self._queues[run_id]
        try:
            while queue:
                notice = queue.popleft()
                try:
                    await self._deliver(notice)
                except Exception:
                    log.exception("could not queue the notifications of run %s", run_id)
        finally:
            del self._queues[run_id], self._workers[run_id]

    async def _deliver(self, notice: Notice) -> None:
        webhooks = [
            *self.service_webhooks,
            *self.agent_webhooks(notice.agent_key),
            *await self.store.of_run(notice.run_id),
        ]
        deliveries = [Delivery.of(w, notice) for w in webhooks if wants(w, notice)]
        if deliveries:
            await self.store.enqueue(deliveries)
            self.wake()

    async def flush(self) -> None:
        """Wait until every notice posted so far is queued in the store."""
        while self._workers:
            await asyncio.wait([asyncio.shield(w) for w in self._workers.values()])


def wants(webhook: Webhook, notice: Notice) -> bool:
    """Whether `webhook` is told `notice`: the agw form the end only, A2A every change."""
    return webhook.format != "agw" or notice.state in TERMINAL_STATES


class _Watch:
    """Reads one run's task states from its events, as they are appended."""

    __slots__ = ("frontend", "notifier", "run", "state")

    def __init__(self, notifier: Notifier, run: RunState) -> None:
        self.notifier = notifier
        self.run = run
        self.state: str = "submitted"
        # Frontend tool calls, whose end waits for the client (a dict as an ordered set,
        # made at the first: most runs have none, and an empty one costs 64 bytes).
        self.frontend: dict[str, None] | None = None

    def __call__(self, event: Event) -> None:
        kind = event.WhichOneof("payload")
        if kind not in _WATCHED or event.parent_tool_id:
            return
        state: State
        if kind == "tool_start":
            if event.tool_start.tool_type not in _SERVICE_TOOL_TYPES:
                if self.frontend is None:
                    self.frontend = {}
                self.frontend[event.tool_start.tool_id] = None
            return
        if kind == "tool_end":
            if self.frontend is None or event.tool_end.tool_id not in self.frontend:
                return
            state = "input-required"
        elif kind in _ASKS:
            state = "input-required"
        else:  # run.start, request.submit
            state = "working"
        if state != self.state:
            self.state = state
            self.notifier.post(self.run, event, state)


_WATCHED: frozenset[str | None] = frozenset(
    {"run_start", "request_submit", "tool_start", "tool_end", *_ASKS}
)
