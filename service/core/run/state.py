"""A run in progress as its runner sees it: identity, task, cancellation, accounting.

The run's events live in its `EventLog`; this is the rest: the task executing
it, why it is being cancelled, which debug events it emits, what its model
calls have cost so far, and who wants to see each finished model turn (the
chat recorder subscribes there, like any observer).
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

from service.core.commands import DebugLevel
from service.core.errors import AgwError
from service.core.events import Event
from service.core.ids import ANONYMOUS, Principal
from service.core.model import ModelRequest, Usage, add_usage
from service.core.run.eventlog import EventLog
from service.core.run.results import TurnResult
from service.core.signals import Flag

#: Cost of a call in the price table's currency: (model, usage) -> cost, None when unpriced.
Pricing = Callable[[str, Usage], float | None]

#: The cancel reason of a run stopped to be resumed elsewhere: it ends with no terminal event.
HANDOVER = "handover"
#: The cancel reason of a run stopped while it only waits for answers: it holds no task
#: until an answer (or a time-out) wakes it, here (see `RunLifecycle`).
PARK = "park"
#: The cancel reasons that stop a run's task without ending the run.
SUSPENDS = frozenset({HANDOVER, PARK})

#: Sees each finished model turn of a run: the request and what the turn produced.
TurnObserver = Callable[[ModelRequest, TurnResult], None]


@dataclass(slots=True)
class Accounting:
    """What a run's model calls have used so far."""

    model_calls: int = 0
    usage: Usage | None = None  # summed over the calls that reported one
    cost: float = 0.0
    currency: str = "USD"
    pricing: Pricing | None = None

    def add_call(self, usage: Usage | None, cost: float) -> None:
        """Count a model call made before the run resumed (its journaled turn)."""
        self.model_calls += 1
        if usage is not None:
            self.usage = add_usage(self.usage, usage)
        self.cost += cost


class RunState:
    """The live state of one run of an agent on a chat."""

    __slots__ = (
        "_ended",
        "_turn_observers",
        "accounting",
        "agent_key",
        "cancel_reason",
        "context_summary",
        "debug_level",
        "failure",
        "fenced",
        "log",
        "owner",
        "parked",
        "resumable",
        "started_at",
        "task",
        "waker",
    )

    def __init__(
        self,
        log: EventLog,
        agent_key: str,
        *,
        debug_level: DebugLevel = DebugLevel.OFF,
        accounting: Accounting | None = None,
        owner: Principal = ANONYMOUS,
    ) -> None:
        self.log = log
        self.agent_key = agent_key
        self.owner = owner  # only the owner may follow, answer or cancel the run
        self.debug_level = debug_level
        self.accounting = accounting if accounting is not None else Accounting()
        self.task: asyncio.Task[None] | None = None
        self.cancel_reason = ""
        self.failure: AgwError | None = None  # why the run is being failed from outside
        # Set when another replica declared this process lost and took the run over: the
        # run is cancelled here and nothing more of it is written (chat records, run log).
        self.fenced = False
        # Parked: its task stopped while it waited; `waker` runs it again (for an answer, a
        # time-out, or to cancel it).
        self.resumable = True  # whether it may go on after its task stopped (the agent's say)
        self.parked = False
        self.waker: Callable[[], None] | None = None
        self.started_at = time.monotonic()
        # A summary of the chat's oldest turns made in this run (service/core/run/window.py),
        # {"text", "through"}: written into the run's next chat record, then cleared.
        self.context_summary: dict[str, str] | None = None
        self._turn_observers: list[TurnObserver] = []
        self._ended = Flag()  # set once the run's task has ended and let go
        log.subject = self

    @property
    def run_id(self) -> str:
        return self.log.run_id

    @property
    def chat_id(self) -> str:
        return self.log.chat_id

    @property
    def done(self) -> bool:
        """Whether the terminal event has been emitted."""
        return self.log.done

    @property
    def terminal(self) -> Event | None:
        return self.log.terminal

    def observe_turns(self, observer: TurnObserver) -> None:
        """Call `observer` with every finished model turn of the run."""
        self._turn_observers.append(observer)

    def turn_finished(self, request: ModelRequest, result: TurnResult) -> None:
        for observer in self._turn_observers:
            observer(request, result)

    def let_go(self, *, parked: bool = False) -> None:
        """The run's task has ended: forget it and the run's turn observers, which refer back to
        the run, so that the run is freed by reference counting once it is released (or, when
        `parked`, holds only its log and waits until it runs again).

        A cancelled task keeps its `CancelledError`, whose traceback keeps the frames it went
        through and their locals: the run's context, and the time-out that refers back to the
        task. Those frames are finished: their locals are cleared here.
        """
        task, self.task = self.task, None
        self._turn_observers = []
        if parked:
            self.cancel_reason = ""
        else:
            self._ended.set()
        if task is not None and task.cancelled():
            try:
                task.result()
            except asyncio.CancelledError as cancelled:
                traceback.clear_frames(cancelled.__traceback__)

    def hand_over(self) -> bool:
        """Stop the run's task without ending the run: its journal has it, and another
        process (or this service, restarted) resumes it (see `HANDOVER`)."""
        return self.cancel(HANDOVER)

    def park(self) -> bool:
        """Stop the run's task while it only waits: its journal and its open waits keep it
        (see `PARK`)."""
        return self.cancel(PARK)

    def cancel(self, reason: str) -> bool:
        """Ask the run's task to stop; the run ends with `run.cancel` carrying `reason`."""
        if self.parked and not self.done and reason not in SUSPENDS and self.waker is not None:
            if not self.cancel_reason:  # it ends at once, without running again
                self.cancel_reason = reason
            self.waker()
            return True
        if self.done or self.task is None or self.task.done():
            return False
        if not self.cancel_reason:
            self.cancel_reason = reason
        self.task.cancel(reason)
        return True

    def fail(self, error: AgwError) -> bool:
        """Stop the run's task for a failure met outside it (its records could not be
        stored): the run ends with `run.error` of `error` instead of `run.cancel`."""
        if self.done or self.task is None or self.task.done() or self.cancel_reason:
            return False
        if self.failure is None:
            self.failure = error
        self.task.cancel(error.reason)
        return True

    async def wait(self) -> None:
        """Wait until the terminal event has been emitted."""
        await self.log.wait()

    async def ended(self) -> None:
        """Wait until the run's task has ended and let go (its end is being kept)."""
        await self._ended.wait()

    def follow(self, after_seq: int = 0) -> AsyncGenerator[Event, None]:
        return self.log.follow(after_seq)

    def relay(self, after_seq: int, send: Callable[[Event], Awaitable[object]]) -> Awaitable[None]:
        """Await `send` with each event after `after_seq` to the end (see `EventLog.relay`)."""
        return self.log.relay(after_seq, send)

    def __repr__(self) -> str:
        return f"RunState({self.run_id!r}, chat={self.chat_id!r}, agent={self.agent_key!r})"
