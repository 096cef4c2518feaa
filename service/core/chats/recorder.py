"""Writes a run into its chat as it goes: one query record, then one step per model turn.

The recorder observes the run like any observer — every finished model turn
(`RunState.observe_turns`) and every emitted event (`EventLog.observe`) — so no
mode has to know about storage.
A step is the turn's messages (the user message on the run's first step,
reasoning, content, one assistant message per tool call sharing `_msgId`) and
the results of its tool calls. A step is complete once every call has its
result; complete steps are written one behind, so that the run's last step
can carry the run's terminal event (`_end`). A summary of the chat's oldest
turns made by the run (service/core/run/window.py) goes into the next step written
(`summary`: its text and the newest run it covers). Events that messages cannot
express (plans, tasks, sources, submits) are kept in the step's `_events`,
each with its position among the message-derived events, so that history
replays exactly as it streamed (see `history.replay`).

Plan tasks running at the same time stream into one run: their turns overlap,
so each task has its own step waiting for its tool results, and a step's events
are no longer contiguous in the run. From the first step whose events mix with
another task's, the run's steps are recorded with positions instead: `_order`
gives the position in the run's history of each event the step's messages
replay as, and each kept event carries its `_pos`.

A record the store could not keep (a full disk, a database gone) is logged as an
error and, while the run is live, ends it with `run.error` STORE_FAILED: its
client learns that the chat's history misses part of the run. Nothing is retried.

A nested run (a subagent called as a tool) is not part of the chat's
conversation: its turns write no step, and its events (snapshot form, with
their `parentToolId`) are kept in `_events` of the step that called it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from service.core import events
from service.core.chats.history import (
    FROM_MESSAGES,
    FROM_RUN,
    event_key,
    event_to_json,
    message_events,
    snapshot_form,
)
from service.core.errors import StoreFailed
from service.core.events import Event
from service.core.ids import ANONYMOUS, Principal
from service.core.model import SIGNATURES, ModelRequest
from service.core.ports import ChatStore
from service.core.run.eventlog import EventLog
from service.core.run.results import TurnResult
from service.core.run.state import RunState
from service.core.run.turn import JournaledTurn
from service.core.signals import Flag
from service.core.values import Record

log = logging.getLogger("agw.store")

PLACEHOLDER_USAGE = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}

#: The events the recorder acts on as they are emitted (it reads the rest at each step's end).
_WATCHED = frozenset(
    {
        "content_start",
        "action_start",
        "tool_start",
        "tool_result",
        "action_result",
        "plan_create",
        "plan_update",
        "plan_revise",
        *events.TERMINALS,
    }
)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def text_parts(text: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": text}]


@dataclass(slots=True)
class Step:
    record: Record
    waiting: set[str] = field(default_factory=set)  # tool ids whose result is missing
    derived: int = 0  # message-derived history events accounted for so far
    kept: list[tuple[int, int, Record]] = field(default_factory=list)  # (position, _at, event)


class ChatRecorder:
    """Records one run into the chat store."""

    __slots__ = (
        "_actions",
        "_closing",
        "_ended",
        "_held",
        "_plan",
        "_position",
        "_positional",
        "_positions",
        "_query",
        "_seq",
        "_shown_content",
        "_skip",
        "_slice_start",
        "_stage",
        "_system",
        "_tool_info",
        "_user_written",
        "_waiting",
        "_writes",
        "_written_plan",
        "first_stage",
        "run",
        "store",
        "user_message",
    )

    def __init__(
        self,
        store: ChatStore,
        run: RunState,
        query: Record,
        user_message: Record,
        first_stage: str,
        *,
        owner: Principal = ANONYMOUS,
        resumed: bool = False,
    ) -> None:
        self.store = store
        self.run = run
        self.user_message = user_message
        self.first_stage = first_stage
        self._seq = 0
        self._system: str | None = None
        self._stage = ""
        self._user_written = False
        # Per plan task ("": the run), its step waiting for its calls' results. This and
        # the other dicts below but one are made when first written to: every run has
        # them, many stay empty, and each costs 64 bytes even then.
        self._waiting: dict[str, Step] | None = None
        self._held: Step | None = None
        self._slice_start = 0  # index in run.log where the next step's events begin
        self._position = 0  # position in the run's history of the next history event
        self._positions: dict[str, int] | None = None  # event_key -> position (message-derived)
        self._positional = False  # steps carry positions (tasks' events interleave)
        # Sets kept as dict keys (an empty set costs 216 bytes).
        self._actions: dict[str, None] | None = None
        self._shown_content: dict[str, None] = {}
        self._tool_info: dict[str, Record] | None = None
        self._plan: Record | None = None
        self._written_plan: Record | None = None
        # Writes are short-lived tasks: their appends happen in creation order, since the
        # store's per-chat lock is FIFO and they take it before their first await. (A new
        # dict once they are all done: an emptied one keeps its table.)
        self._writes: dict[asyncio.Task[None], None] = {}
        self._closing: asyncio.Task[None] | None = None
        self._ended = Flag()
        self._skip = 0  # records written before the run resumed: not sent again
        self._query: Record | None = None  # the query record, until it is sent
        if resumed:  # see `resume`
            return
        record: Record = {
            "_type": "query",
            "chatId": run.chat_id,
            "runId": run.run_id,
            "updatedAt": now_ms(),
            "query": query,
        }
        if not owner.anonymous:  # who owns the chat (and so its runs)
            record["owner"] = owner.to_record()
        # The query record is sent by `open`, once the run's first model request is out:
        # the request leaves before a new chat's file is created. Records sent before then
        # carry it first: appends keep their order.
        self._query = record
        run.observe_turns(self._on_turn)
        run.log.observe(self._on_event)

    @classmethod
    def resume(
        cls,
        store: ChatStore,
        run: RunState,
        query: Record,
        user_message: Record,
        first_stage: str,
        *,
        owner: Principal,
        journaled: Sequence[Event],
        turns: Sequence[JournaledTurn],
        written: int,
    ) -> ChatRecorder:
        """The recorder of a resumed run, as it stood when the run stopped.

        It is rebuilt by going through the run once more as it happened: its journaled
        events in order, each journaled turn where it ended. Of the records that makes,
        the first `written` steps were written already and are not sent again; the
        others are (the one held back, or any whose append was lost).
        """
        recorder = cls(store, run, query, user_message, first_stage, owner=owner, resumed=True)
        recorder._skip = written
        scratch = RunState(EventLog(run.run_id, run.chat_id), run.agent_key, owner=owner)
        recorder.run = scratch
        ends = sorted(turns, key=lambda turn: turn.end)  # stable: journal order on ties
        pending = 0
        for index in range(len(journaled) + 1):
            while pending < len(ends) and ends[pending].end == index:
                turn = ends[pending]
                recorder._on_turn(turn.request(), turn.result)
                pending += 1
            for turn in ends:
                if turn.start == index and turn.summary is not None:
                    scratch.context_summary = turn.summary
            if index < len(journaled):
                scratch.log.keep(journaled[index])
                recorder._on_event(journaled[index])
        recorder.run = run
        run.context_summary = scratch.context_summary
        run.observe_turns(recorder._on_turn)
        run.log.observe(recorder._on_event)
        return recorder

    def open(self) -> None:
        """Send the run's query record (unless a record sent before took it along)."""
        if self._query is not None:
            self._send([])

    def follow_turns(self) -> None:
        """Observe the run's model turns again: it was parked (its task stopped, and with it
        the run's turn observers) and now runs again."""
        self.run.observe_turns(self._on_turn)

    async def written(self) -> None:
        """Wait until the records sent so far are written (or failed)."""
        if self._writes:
            await asyncio.gather(*self._writes)

    async def closed(self) -> None:
        """Wait until everything of the run is written and synced."""
        await self._ended.wait()
        assert self._closing is not None
        await asyncio.shield(self._closing)

    # Observers -----------------------------------------------------------------

    def _on_turn(self, request: ModelRequest, result: TurnResult) -> None:
        if result.parent_tool_id:  # a nested run's turn: its events are kept, not its messages
            return
        previous = self._waiting.pop(result.task_id, None) if self._waiting else None
        if previous is not None:  # a new turn began before all results came in
            self._complete(previous)
        system = ""
        if request.messages and request.messages[0].get("role") == "system":
            system = str(request.messages[0].get("content") or "")
        record: Record = {
            "_type": "step",
            "chatId": self.run.chat_id,
            "runId": self.run.run_id,
            "_stage": request.stage,
        }
        if result.task_id:
            record["taskId"] = result.task_id
        if self._system is None or (request.stage != self._stage and system != self._system):
            record["system"] = system
        self._system, self._stage = system, request.stage
        record["messages"] = self._turn_messages(result)
        step = Step(record, {c.id for c in result.tool_calls})
        if step.waiting:
            if self._waiting is None:
                self._waiting = {}
            self._waiting[result.task_id] = step
        else:
            self._complete(step)

    def _turn_messages(self, result: TurnResult) -> list[Record]:
        messages: list[Record] = []
        if not self._user_written:
            messages.append(self.user_message)
            self._user_written = True
        ts = now_ms()
        meta = {"_msgId": result.msg_id}
        if result.reasoning:
            messages.append(
                {
                    "role": "assistant",
                    "reasoning_content": text_parts(result.reasoning),
                    "ts": ts,
                    "_reasoningId": result.reasoning_id,
                    **meta,
                }
            )
        if result.content and result.content_id in self._shown_content:
            messages.append(
                {
                    "role": "assistant",
                    "content": text_parts(result.content),
                    "ts": ts,
                    "_contentId": result.content_id,
                    **meta,
                }
            )
        for call in result.tool_calls:
            kind = "_actionId" if self._actions and call.id in self._actions else "_toolId"
            message: Record = {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": call.upstream_id or call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                ],
                "ts": ts,
                kind: call.id,
                **meta,
            }
            if self._tool_info:
                message.update(self._tool_info.get(call.id, {}))
            messages.append(message)
        assistant = [m for m in messages if m["role"] == "assistant"]
        answer = [m for m in assistant if "reasoning_content" not in m]
        if answer and result.signatures:  # kept with what memory gives back to the model
            answer[-1][SIGNATURES] = list(result.signatures)
        if assistant:
            assistant[-1]["_timing"] = {
                "firstDeltaMs": round(result.first_delta_ms or 0.0, 1),
                "durationMs": round(result.duration_ms, 1),
            }
            usage = result.usage
            assistant[-1]["_usage"] = (
                {
                    "prompt_tokens": usage.prompt_tokens,
                    "completion_tokens": usage.completion_tokens,
                    "total_tokens": usage.total_tokens,
                    "reasoning_tokens": usage.reasoning_tokens,
                    "cached_tokens": usage.cached_tokens,
                }
                if usage is not None
                else dict(PLACEHOLDER_USAGE)
            )
        return messages

    def _on_event(self, event: Event) -> None:
        field_name = event.WhichOneof("payload")
        if field_name not in _WATCHED:  # the deltas, above all (checked first: the cheapest)
            return
        if event.parent_tool_id:  # a nested run's event: kept with the calling step
            return
        if field_name == "content_start":
            self._shown_content[event.content_start.content_id] = None
        elif field_name == "action_start":
            if self._actions is None:
                self._actions = {}
            self._actions[event.action_start.action_id] = None
        elif field_name == "tool_start":
            start = event.tool_start
            info: Record = {}
            if start.tool_type:
                info["_toolType"] = start.tool_type
            if start.description:
                info["_description"] = start.description
            if self._tool_info is None:
                self._tool_info = {}
            self._tool_info[start.tool_id] = info
        elif field_name in ("tool_result", "action_result"):
            self._add_result(event, field_name)
        elif field_name in ("plan_create", "plan_update", "plan_revise"):
            payload = getattr(event, field_name)
            self._plan = {"planId": payload.plan_id, **events.to_dict(payload.plan)}
        elif field_name in ("run_complete", "run_error", "run_cancel"):
            self._finish(event)

    def _add_result(self, event: Event, field_name: str) -> None:
        if field_name == "tool_result":
            tool_id, result = event.tool_result.tool_id, event.tool_result.result
        else:
            tool_id, result = event.action_result.action_id, event.action_result.result
        waiting = self._waiting
        if not waiting:
            return
        owner = next((k for k, s in waiting.items() if tool_id in s.waiting), None)
        if owner is None:
            return
        step = waiting[owner]
        value: Any = events.from_value(result)
        is_json = not isinstance(value, str)
        calls = {
            m.get("_toolId") or m.get("_actionId"): m
            for m in step.record["messages"]
            if m.get("tool_calls")
        }
        call = calls.get(tool_id, {})
        kind = "_actionId" if field_name == "action_result" else "_toolId"
        message: Record = {
            "role": "tool",
            "name": call.get("tool_calls", [{}])[0].get("function", {}).get("name", ""),
            "tool_call_id": call.get("tool_calls", [{}])[0].get("id", tool_id),
            "content": text_parts(
                json.dumps(value, ensure_ascii=False, sort_keys=True) if is_json else value
            ),
            "ts": event.timestamp,
            kind: tool_id,
        }
        if is_json:
            message["_json"] = True
        if field_name == "tool_result" and event.tool_result.error:
            message["_error"] = True
        if field_name == "tool_result" and event.tool_result.cached:
            message["_cached"] = True
        if field_name == "tool_result" and event.tool_result.rendered_arguments:
            message["_renderedArguments"] = event.tool_result.rendered_arguments
        step.record["messages"].append(message)
        step.waiting.discard(tool_id)
        if not step.waiting:
            del waiting[owner]
            self._complete(step)

    # Steps -------------------------------------------------------------------------

    def _complete(self, step: Step) -> None:
        if self._held is not None:
            self._write(self._held)
        self._held = step
        self._attach_events(step)

    def _attach_events(self, step: Step) -> None:
        """Keep the step's events that messages cannot express, with their positions."""
        log_slice = self.run.log[self._slice_start :]
        self._slice_start = len(self.run.log)
        history = [e for e in snapshot_form(log_slice) if e.WhichOneof("payload") not in FROM_RUN]
        task_id = step.record.get("taskId", "")
        if any(
            e.WhichOneof("payload") in FROM_MESSAGES
            and not e.parent_tool_id
            and e.task_id != task_id
            for e in history
        ):
            self._positional = True  # another task's turn streamed within this step's
        for event in history:
            position, self._position = self._position, self._position + 1
            if event.WhichOneof("payload") in FROM_MESSAGES and not event.parent_tool_id:
                if self._positions is None:
                    self._positions = {}
                self._positions[event_key(event)] = position
                step.derived += 1
            else:
                step.kept.append((position, step.derived, event_to_json(event)))

    def _write(self, step: Step) -> None:
        self._seq += 1
        step.record["_seq"] = self._seq
        step.record["updatedAt"] = now_ms()
        if self._positional:  # positions in the run's history (see the module docstring)
            derived = [e for m in step.record["messages"] for e in message_events(m)]
            positions = self._positions or {}
            step.record["_order"] = [positions.get(event_key(e), -1) for e in derived]
            kept = [{"_pos": position, **event} for position, _, event in step.kept]
        else:
            kept = [{"_at": at, **event} for _, at, event in step.kept]
        if kept:
            step.record["_events"] = kept
        if self._plan is not None and self._plan != self._written_plan:
            step.record["plan"] = self._written_plan = self._plan  # the plan as of this step
        if self.run.context_summary is not None:  # the chat's later runs start from it
            step.record["summary"] = self.run.context_summary
            self.run.context_summary = None
        self._send([step.record])

    def _finish(self, terminal: Event) -> None:
        for waiting in list(self._waiting.values()) if self._waiting else ():
            self._complete(waiting)  # calls left without a result
        self._waiting = None
        step = self._held
        if step is None:  # the run ended before any model turn: keep its user message
            step = Step(
                {
                    "_type": "step",
                    "chatId": self.run.chat_id,
                    "runId": self.run.run_id,
                    "_stage": self.first_stage,
                    "messages": self._turn_messages_empty(),
                }
            )
            self._attach_events(step)
        else:
            self._attach_events(step)  # events after the last turn (e.g. a final plan update)
        step.record["_end"] = event_to_json(terminal)
        self._write(step)
        self._held = None
        self._closing = asyncio.create_task(self._close(), name=f"record-{self.run.run_id}")
        self._ended.set()

    def _turn_messages_empty(self) -> list[Record]:
        if self._user_written:
            return []
        self._user_written = True
        return [self.user_message]

    def _send(self, records: list[Record]) -> None:
        if self._query is not None:
            records = [self._query, *records]
            self._query = None
        if self._skip:
            kept = [r for r in records if r.get("_type") != "step" or self._new()]
            if not kept:
                return
            records = kept
        task = asyncio.create_task(self._append(records))
        self._writes[task] = None
        task.add_done_callback(self._written)

    def _written(self, task: asyncio.Task[None]) -> None:
        self._writes.pop(task, None)
        if not self._writes:
            self._writes = {}

    def _new(self) -> bool:
        """Whether the step record about to be sent is new: not one written before the run
        resumed."""
        if not self._skip:
            return True
        self._skip -= 1
        return False

    async def _append(self, records: list[Record]) -> None:
        if self.run.fenced:  # another replica took the run over: write nothing more
            return
        try:
            await self.store.append(self.run.chat_id, records)
        except Exception as error:
            self._failed(error)

    def _failed(self, error: Exception) -> None:
        """A record could not be stored (the store kept none of it): say so, and end the
        run with `run.error` STORE_FAILED while it is live — its chat's history misses what
        could not be written, which its client must know."""
        run = self.run
        if isinstance(error, StoreFailed):
            failure = error
        else:  # a bug, or a store's unforeseen failure
            log.error("could not record run %s in chat %s", run.run_id, run.chat_id, exc_info=error)
            failure = StoreFailed(f"could not record the run in chat {run.chat_id!r}")
        live = run.fail(failure)
        log.error(
            "run %s: could not record it in chat %s (%s)%s",
            run.run_id,
            run.chat_id,
            failure.message,
            "; ending the run with STORE_FAILED" if live else "",
        )

    async def _close(self) -> None:
        # The writes' tasks were made before this one, so they have handed their records
        # to the store already; the sync, handed over now, comes after them (a store keeps
        # a chat's work in order) and may go to the disk in the same batch.
        try:
            await self.store.sync(self.run.chat_id)
        except Exception:
            log.exception("could not sync chat %s", self.run.chat_id)
        await asyncio.gather(*self._writes)


def user_message(text: str, parts: list[Record] | None = None) -> Record:
    """The stored form of the user's message (text first, then any attachment parts)."""
    return {"role": "user", "content": text_parts(text) + (parts or []), "ts": now_ms()}
