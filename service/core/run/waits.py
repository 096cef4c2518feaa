"""Tools of a run waiting for the user's answer, and the answers `Submit` brings.

A frontend tool call (or a question, a permission, a plan approval) registers a
wait under (run id, tool id) and suspends until `submit` delivers a payload or
the wait times out. Every wait keeps its final state until its run is
forgotten, so that `Submit` can answer precisely: accepted; unknown run;
unknown tool; already answered; expired (timed out, or the run stopped waiting
because it ended). A payload larger than the configured limit is refused before
anything else (`PayloadTooLarge`). An accepted answer is announced on the
run's stream as `request.submit`, in the scope (plan task) that waits for it.

A wait's deadline is kept with the run (a step of its journal): a run resumed
after a restart waits only for what is left of the time-out. A run that does
nothing but wait can be parked (service/core/lifecycle.py): its task is
stopped, its waits stay open here (`park`), and an answer then wakes it
(`on_parked_answer`): the run runs again from its journal and takes the answer.

This is the owner's side of the `RunBus`: the in-process bus uses it directly;
a distributed bus delivers the Submits it receives to it.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from service.core import events
from service.core.commands import SubmitCommand, SubmitResult
from service.core.errors import InvalidRequest, PayloadTooLarge
from service.core.ids import shorten
from service.core.run.eventlog import Emitter
from service.core.run.observation import submit_wait
from service.core.values import OpenWait, WaitKind

if TYPE_CHECKING:
    from service.core.run.state import RunState
    from service.core.values import RunRef

WaitState = Literal["waiting", "answered", "expired", "closed"]
ANSWERED, TIMED_OUT = "answered", "timed_out"  # how a wait ended, as its step keeps it


#: Told the open waits of a run each time one opens or closes: (run id, its open waits).
WaitsObserver = Callable[[str, list[OpenWait]], None]


class WaitTimedOut(Exception):
    """Nobody answered within the time-out."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"no answer within {timeout_s:g} s")
        self.timeout_s = timeout_s


_NO_ANSWER: Any = object()


@dataclass(slots=True)
class _Wait:
    tool_name: str
    kind: WaitKind
    out: Emitter
    future: asyncio.Future[Any]
    deadline: float  # when it times out, in seconds since the epoch
    state: WaitState = "waiting"
    parked: bool = False  # its run's task is stopped: an answer wakes the run
    answer: Any = _NO_ANSWER  # what a parked wait was answered


def payload_size(payload: Any) -> int:
    """The size of a JSON payload, in bytes of compact UTF-8 JSON."""
    return len(json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode())


class Waits:
    """The tools of the runs of this process that wait (or waited) for `Submit`."""

    def __init__(self, *, timeout_s: float = 300.0, payload_limit_bytes: int = 256 * 1024) -> None:
        self.timeout_s = timeout_s
        self.payload_limit_bytes = payload_limit_bytes
        self._runs: dict[str, dict[str, _Wait]] = {}
        self._observers: list[WaitsObserver] = []
        # Told the id of a parked run one of whose waits was just answered (or closed).
        self.on_parked_answer: Callable[[str], None] | None = None

    def observe(self, observer: WaitsObserver) -> None:
        """Tell `observer` a run's open waits whenever one opens or closes."""
        self._observers.append(observer)

    def waiting(self, run_id: str) -> list[str]:
        """The tool ids of `run_id` that wait for an answer right now."""
        return [wait.tool_id for wait in self.open_waits(run_id)]

    def open_waits(self, run_id: str) -> list[OpenWait]:
        """The waits of `run_id` open right now, in the order they opened."""
        waits = self._runs.get(run_id, {})
        return [
            OpenWait(tool_id, w.kind, w.tool_name)
            for tool_id, w in waits.items()
            if w.state == "waiting"
        ]

    def _changed(self, run_id: str) -> None:
        if self._observers:
            waits = self.open_waits(run_id)
            for observer in self._observers:
                observer(run_id, waits)

    async def wait(
        self,
        out: Emitter,
        tool_id: str,
        tool_name: str,
        timeout_s: float | None = None,
        *,
        kind: WaitKind = "frontend_tool",
    ) -> Any:
        """Suspend until `tool_id` is answered; its payload (WaitTimedOut on time-out).

        The wait is a step of the run (service/core/run/journal.py), and so is its
        deadline: a resumed run is given its journaled answer (or time-out) at once, or
        the answer its journal holds for it (accepted before the run stopped), or waits
        for what is left of its time-out.
        """
        timeout = self.timeout_s if timeout_s is None else timeout_s

        async def deadline() -> float:
            return time.time() + timeout

        until = await out.step("deadline", deadline, float, float, key=f"deadline {tool_id}")

        async def waited() -> tuple[str, Any]:
            replay = out.log.steps.replay if out.log.steps is not None else None
            if replay is not None and tool_id in replay.answers:
                return ANSWERED, replay.answers[tool_id]
            try:
                return ANSWERED, await self._wait(out, tool_id, tool_name, timeout, until, kind)
            except WaitTimedOut:
                return TIMED_OUT, timeout

        outcome, value = await out.step(
            "wait", waited, list, lambda data: (data[0], data[1]), key=f"wait {tool_id}"
        )
        if outcome == TIMED_OUT:
            raise WaitTimedOut(value)
        return value

    async def _wait(
        self,
        out: Emitter,
        tool_id: str,
        tool_name: str,
        limit_s: float,
        deadline: float,
        kind: WaitKind,
    ) -> Any:
        earlier = self._runs.get(out.run_id, {}).get(tool_id)
        if earlier is not None and earlier.answer is not _NO_ANSWER:
            return earlier.answer  # answered while its run was parked
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        wait = _Wait(tool_name, kind, out, future, deadline)
        self._runs.setdefault(out.run_id, {})[tool_id] = wait
        self._changed(out.run_id)
        started = time.monotonic()
        try:
            async with asyncio.timeout(max(0.0, deadline - time.time())):
                return await future
        except TimeoutError:
            if future.done() and not future.cancelled():  # answered at the very last moment
                return future.result()
            wait.state = "expired"
            raise WaitTimedOut(limit_s) from None
        finally:
            if wait.state == "waiting" and not wait.parked:
                wait.state = "closed"  # cancelled: the run stopped waiting
            if not future.done():
                future.cancel()
            self._changed(out.run_id)
            submit_wait.record(time.monotonic() - started, {"agw.outcome": wait.state})

    def park(self, run_id: str) -> float | None:
        """The run's task is being stopped to park it: its open waits stay open; the
        earliest of their deadlines (None: it has none open)."""
        deadlines = []
        for wait in self._runs.get(run_id, {}).values():
            if wait.state == "waiting":
                wait.parked = True
                deadlines.append(wait.deadline)
        return min(deadlines, default=None)

    def close(self, run_id: str) -> None:
        """The parked run ended without waking (cancelled): its waits are closed."""
        for wait in self._runs.get(run_id, {}).values():
            if wait.state == "waiting":
                wait.state = "closed"
        self._changed(run_id)

    def check(self, command: SubmitCommand) -> None:
        """Refuse a malformed or oversized submit before looking for its run."""
        if not command.run_id:
            raise InvalidRequest("runId is required")
        if not command.tool_id:
            raise InvalidRequest("toolId is required")
        size = payload_size(command.payload)
        if size > self.payload_limit_bytes:
            raise PayloadTooLarge(
                f"payload of {size} bytes exceeds the limit of {self.payload_limit_bytes} bytes",
                limit=str(self.payload_limit_bytes),
            )

    def deliver(self, command: SubmitCommand, run: RunRef | RunState | None) -> SubmitResult:
        """Deliver `command` to `run` (None: unknown here); a run of another chat than the
        command names, or of another principal than its sender, is an unknown run."""
        if run is not None and command.chat_id and command.chat_id != run.chat_id:
            run = None
        if run is not None and run.owner != command.principal:
            run = None
        return self.submit(command, run_known=run is not None)

    def submit(self, command: SubmitCommand, *, run_known: bool) -> SubmitResult:
        """Deliver the payload of `command` to its waiting tool (`run_known`: the run exists)."""
        self.check(command)
        if not run_known:
            return SubmitResult("UNKNOWN_RUN", "no active or recent run with that id")
        tool_id = command.tool_id
        wait = self._runs.get(command.run_id, {}).get(tool_id)
        if wait is None:
            waiting = ", ".join(self.waiting(command.run_id)) or "none"
            return SubmitResult(
                "UNKNOWN_TOOL",
                f"run {command.run_id} has no tool {shorten(tool_id)!r} (waiting: {waiting})",
            )
        if wait.state == "answered":
            return SubmitResult("ALREADY_ANSWERED", f"tool {tool_id!r} was already answered")
        if wait.state == "expired":
            return SubmitResult("EXPIRED", f"tool {tool_id!r} stopped waiting (timed out)")
        if wait.state == "closed" or wait.out.done:
            return SubmitResult("EXPIRED", f"tool {tool_id!r} stopped waiting (the run ended)")
        wait.state = "answered"
        wait.out.emit(
            events.request_submit(
                command.request_id or str(uuid.uuid4()),
                tool_id,
                command.payload,
                view_id=command.view_id,
            )
        )
        if wait.parked:  # the run takes it when it runs again
            wait.answer = command.payload
            self._changed(command.run_id)
            if self.on_parked_answer is not None:
                self.on_parked_answer(command.run_id)
        else:
            wait.future.set_result(command.payload)
        return SubmitResult("ACCEPTED", f"tool {tool_id!r} ({wait.tool_name}) took the payload")

    def forget(self, run_id: str) -> None:
        """Drop what is known about the waits of `run_id` (when the run is forgotten)."""
        self._runs.pop(run_id, None)
