"""Frontend tools waiting for the user's answer, and the answers `Submit` brings.

A frontend tool call registers a wait under (run id, tool id) and suspends its
run until `submit` delivers a payload or the wait times out. Every wait keeps
its final state until its run is forgotten, so that `Submit` can answer
precisely: accepted; unknown run; unknown tool; already answered; expired (timed
out, or the run stopped waiting because it ended). A payload larger than the
configured limit is refused before anything else (`PayloadTooLarge`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from google.protobuf import json_format, struct_pb2

from service.core import events
from service.core.errors import InvalidRequest, PayloadTooLarge
from service.core.instruments import submit_wait
from service.core.run import Run

SubmitOutcome = Literal["ACCEPTED", "UNKNOWN_RUN", "UNKNOWN_TOOL", "ALREADY_ANSWERED", "EXPIRED"]
WaitState = Literal["waiting", "answered", "expired", "closed"]


@dataclass(frozen=True, slots=True)
class SubmitResult:
    """What happened to a submitted payload."""

    outcome: SubmitOutcome
    detail: str

    @property
    def accepted(self) -> bool:
        return self.outcome == "ACCEPTED"


class WaitTimedOut(Exception):
    """Nobody answered the frontend tool within its time-out."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"no answer within {timeout_s:g} s")
        self.timeout_s = timeout_s


@dataclass(slots=True)
class _Wait:
    tool_name: str
    future: asyncio.Future[Any]
    state: WaitState = "waiting"


class Waits:
    """The frontend tools of all runs that wait (or waited) for `Submit`."""

    def __init__(self, *, timeout_s: float = 300.0, payload_limit_bytes: int = 256 * 1024) -> None:
        self.timeout_s = timeout_s
        self.payload_limit_bytes = payload_limit_bytes
        self._runs: dict[str, dict[str, _Wait]] = {}

    def waiting(self, run_id: str) -> list[str]:
        """The tool ids of `run_id` that wait for an answer right now."""
        waits = self._runs.get(run_id, {})
        return [tool_id for tool_id, w in waits.items() if w.state == "waiting"]

    async def wait(
        self,
        run: Run,
        tool_id: str,
        tool_name: str,
        timeout_s: float | None = None,
    ) -> Any:
        """Suspend until `tool_id` is answered; its payload as JSON (WaitTimedOut on time-out)."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        wait = self._runs.setdefault(run.run_id, {})[tool_id] = _Wait(tool_name, future)
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            if future.done() and not future.cancelled():  # answered at the very last moment
                return future.result()
            wait.state = "expired"
            raise WaitTimedOut(timeout) from None
        finally:
            if wait.state == "waiting":
                wait.state = "closed"  # cancelled: the run stopped waiting
            if not future.done():
                future.cancel()
            submit_wait.record(time.monotonic() - started, {"agw.outcome": wait.state})

    def submit(
        self,
        run: Run | None,
        tool_id: str,
        payload: struct_pb2.Value,
        *,
        request_id: str = "",
        view_id: str = "",
    ) -> SubmitResult:
        """Deliver `payload` to the waiting `tool_id` of `run` (None: no such run)."""
        if not tool_id:
            raise InvalidRequest("toolId is required")
        size = payload.ByteSize()
        if size > self.payload_limit_bytes:
            raise PayloadTooLarge(
                f"payload of {size} bytes exceeds the limit of {self.payload_limit_bytes} bytes",
                limit=str(self.payload_limit_bytes),
            )
        if run is None:
            return SubmitResult("UNKNOWN_RUN", "no active or recent run with that id")
        wait = self._runs.get(run.run_id, {}).get(tool_id)
        if wait is None:
            waiting = ", ".join(self.waiting(run.run_id)) or "none"
            return SubmitResult(
                "UNKNOWN_TOOL", f"run {run.run_id} has no tool {tool_id!r} (waiting: {waiting})"
            )
        if wait.state == "answered":
            return SubmitResult("ALREADY_ANSWERED", f"tool {tool_id!r} was already answered")
        if wait.state == "expired":
            return SubmitResult("EXPIRED", f"tool {tool_id!r} stopped waiting (timed out)")
        if wait.state == "closed" or run.done:
            return SubmitResult("EXPIRED", f"tool {tool_id!r} stopped waiting (the run ended)")
        wait.state = "answered"
        run.emit(
            events.request_submit(
                request_id or str(uuid.uuid4()), tool_id, payload, view_id=view_id
            )
        )
        wait.future.set_result(json_format.MessageToDict(payload))
        return SubmitResult("ACCEPTED", f"tool {tool_id!r} ({wait.tool_name}) took the payload")

    def forget(self, run_id: str) -> None:
        """Drop what is known about the waits of `run_id` (when the run is forgotten)."""
        self._runs.pop(run_id, None)
