"""History as events: the snapshot form of a live stream, and its replay from chat records.

The snapshot form of a run's events keeps what a reader of history needs and
collapses each streamed block into one event: `reasoning.*` → one
`reasoning.snapshot`, `content.*` → `content.snapshot`, `tool.start/args/end`
→ `tool.snapshot`, `action.start/args/end` → `action.snapshot`, placed where
the block started. `tool.result`/`action.result`, plans, tasks and the run's
terminal event are kept; live-only events (heartbeats, debug, usage,
`action.param`, which would re-trigger a client action) are dropped.

`GetChat` rebuilds the same snapshot form from the stored records (see
`replay`), so history read back equals what the live stream showed. A step's
events are those its messages replay as, and the events it keeps (`_events`);
they follow each other as the step's `_at` positions say, or — in a run whose
plan tasks streamed at the same time — they take the places in the run's history
that the step's `_order` and `_pos` positions give.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agw.v1 import events_pb2 as pb
from google.protobuf import json_format

from service.core import events
from service.core.events import EVENT_TYPES, Event
from service.core.ids import chat_name_of
from service.core.values import Record

#: Live-only events, absent from history.
DROPPED = frozenset(
    {
        "heartbeat",
        "model_start",
        "model_end",
        "model_fallback",
        "usage_update",
        "tool_timing",
        "action_param",
    }
)
#: Events rebuilt from a step's messages (everything else of a step is kept in `_events`).
FROM_MESSAGES = frozenset(
    {
        "reasoning_snapshot",
        "content_snapshot",
        "tool_snapshot",
        "action_snapshot",
        "tool_result",
        "action_result",
    }
)
#: Events rebuilt from the query record and the step's `_end`.
FROM_RUN = frozenset({"request_query", "chat_start", "run_start", *events.TERMINALS})


def snapshot_form(live: Sequence[Event]) -> list[Event]:
    """Collapse a run's live events into history events (seq left 0, timestamps of the starts)."""
    out: list[Event] = []
    blocks: dict[str, tuple[Event, list[str]]] = {}  # block id -> (snapshot event, text parts)
    for event in live:
        field = event.WhichOneof("payload")
        if field is None or field in DROPPED:
            continue
        if field == "reasoning_start":
            rid = event.reasoning_start.reasoning_id
            snap = events.Event(reasoning_snapshot=pb.ReasoningSnapshot(reasoning_id=rid))
            blocks[rid] = (_stamp(snap, event), [])
            out.append(snap)
        elif field == "content_start":
            cid = event.content_start.content_id
            snap = events.Event(content_snapshot=pb.ContentSnapshot(content_id=cid))
            blocks[cid] = (_stamp(snap, event), [])
            out.append(snap)
        elif field == "tool_start":
            s = event.tool_start
            snap = events.Event(
                tool_snapshot=pb.ToolSnapshot(
                    tool_id=s.tool_id,
                    tool_name=s.tool_name,
                    tool_type=s.tool_type,
                    tool_api=s.tool_api,
                    tool_params=s.tool_params if s.HasField("tool_params") else None,
                    description=s.description,
                )
            )
            blocks[s.tool_id] = (_stamp(snap, event), [])
            out.append(snap)
        elif field == "action_start":
            a = event.action_start
            snap = events.Event(
                action_snapshot=pb.ActionSnapshot(
                    action_id=a.action_id, action_name=a.action_name, description=a.description
                )
            )
            blocks[a.action_id] = (_stamp(snap, event), [])
            out.append(snap)
        elif field in ("reasoning_delta", "content_delta", "tool_args", "action_args"):
            payload = getattr(event, field)
            block_id = getattr(payload, _ID_FIELD[field])
            if block_id in blocks:
                blocks[block_id][1].append(payload.delta)
        elif field in ("reasoning_end", "content_end", "tool_end", "action_end"):
            block_id = getattr(getattr(event, field), _ID_FIELD[field])
            if block_id in blocks:
                _fill(*blocks.pop(block_id))
        else:
            copy = Event()
            copy.CopyFrom(event)
            copy.seq = 0
            out.append(copy)
    for snap, parts in blocks.values():  # blocks left open by a crash
        _fill(snap, parts)
    return out


_ID_FIELD = {
    "reasoning_delta": "reasoning_id",
    "content_delta": "content_id",
    "tool_args": "tool_id",
    "action_args": "action_id",
    "reasoning_end": "reasoning_id",
    "content_end": "content_id",
    "tool_end": "tool_id",
    "action_end": "action_id",
}


def _stamp(snap: Event, start: Event) -> Event:
    snap.type = EVENT_TYPES[snap.WhichOneof("payload") or ""]
    snap.timestamp, snap.chat_id, snap.run_id = start.timestamp, start.chat_id, start.run_id
    snap.task_id, snap.parent_tool_id = start.task_id, start.parent_tool_id
    return snap


def _fill(snap: Event, parts: list[str]) -> None:
    text = "".join(parts)
    field = snap.WhichOneof("payload")
    if field in ("reasoning_snapshot", "content_snapshot"):
        getattr(snap, field).text = text
    else:
        getattr(snap, field or "").arguments = text


# Replay from records -------------------------------------------------------------


def event_to_json(event: Event) -> dict[str, Any]:
    """An event as stored in a step's `_events` (proto JSON, envelope ids omitted)."""
    data = json_format.MessageToDict(event)
    for key in ("seq", "chatId", "runId"):
        data.pop(key, None)
    return data


def replay(records: list[Record]) -> list[Event]:
    """Rebuild the snapshot-form events of a chat from its stored records, seq from 1."""
    out: list[Event] = []
    first_query = True
    run = _RunHistory("")
    changes: list[Event] = []  # of the chat, while a run's steps are still being placed
    for record in records:
        chat_id, run_id = str(record.get("chatId", "")), str(record.get("runId", ""))
        if record.get("_type") == "update":  # a change of the chat: after the run it met
            changes.append(_update_event(record, chat_id))
            if not run.run_id:
                out.extend(changes)
                changes = []
            continue
        if run_id != run.run_id:
            out.extend(run.events())
            out.extend(changes)
            changes = []
            run = _RunHistory(run_id)
        if record.get("_type") == "query":
            out.extend(_query_events(record, chat_id, run_id, first_query))
            first_query = False
            continue
        terminal = run.add_step(record, chat_id)
        if terminal is not None:
            out.extend(run.events())
            out.append(terminal)
    out.extend(run.events())
    out.extend(changes)
    for seq, event in enumerate(out, 1):
        event.seq = seq
    return out


def update_record(
    chat_id: str, updated_at: int, chat_name: str, previous: str, request_id: str
) -> Record:
    """The record of a rename in the chat's records (`_type` "update")."""
    return {
        "_type": "update",
        "chatId": chat_id,
        "updatedAt": updated_at,
        "chatName": chat_name,
        "previousChatName": previous,
        "requestId": request_id,
    }


def _update_event(record: Record, chat_id: str) -> Event:
    event = events.chat_update(
        str(record.get("chatName") or ""),
        request_id=str(record.get("requestId") or ""),
        previous_chat_name=str(record.get("previousChatName") or ""),
    )
    return _envelope(event, chat_id, "", int(record.get("updatedAt") or 0))


def event_key(event: Event) -> str:
    """What identifies a message-derived history event within its run."""
    field = event.WhichOneof("payload") or ""
    payload = getattr(event, field)
    if field == "tool_result":
        return "result:" + str(payload.tool_id)
    if field == "action_result":
        return "result:" + str(payload.action_id)
    return "block:" + str(getattr(payload, _SNAPSHOT_ID[field]))


_SNAPSHOT_ID = {
    "reasoning_snapshot": "reasoning_id",
    "content_snapshot": "content_id",
    "tool_snapshot": "tool_id",
    "action_snapshot": "action_id",
}


def message_events(message: Record) -> list[Event]:
    """The history events a stored message replays as (envelope ids left empty)."""
    return _message_events(message, "", "", "")


class _RunHistory:
    """The step events of one run, each at its position in the run's history."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._placed: list[tuple[int, int, Event]] = []  # (position, arrival, event)
        self._next = 0  # the position of a step's next event when its record has none

    def add_step(self, record: Record, chat_id: str) -> Event | None:
        """Place the events of a step record; its terminal event, if it has one."""
        placed = _step_events(record, chat_id, self.run_id)
        for position, event in placed:
            if position is None or position < 0:  # in the order of the step's record
                position = self._next if position is None else max(self._next - 1, 0)
            self._next = max(self._next, position + 1)
            self._placed.append((position, len(self._placed), event))
        end = record.get("_end")
        if not isinstance(end, dict):
            return None
        terminal = Event()
        json_format.ParseDict(end, terminal, ignore_unknown_fields=True)
        terminal.chat_id, terminal.run_id = chat_id, self.run_id
        return terminal

    def events(self) -> list[Event]:
        """The events placed so far, in history order (and forgotten)."""
        ordered = [event for _, _, event in sorted(self._placed, key=lambda p: (p[0], p[1]))]
        self._placed = []
        return ordered


def _envelope(event: Event, chat_id: str, run_id: str, ts: int, task_id: str = "") -> Event:
    event.type = EVENT_TYPES[event.WhichOneof("payload") or ""]
    event.chat_id, event.run_id, event.timestamp = chat_id, run_id, ts
    event.task_id = task_id
    return event


def _query_events(record: Record, chat_id: str, run_id: str, first: bool) -> list[Event]:
    query = dict(record.get("query") or {})
    query.pop("chatId", None)
    ts = int(record.get("updatedAt") or 0)
    request = Event()
    json_format.ParseDict(query, request.request_query, ignore_unknown_fields=True)
    out = [_envelope(request, chat_id, run_id, ts)]
    if first:
        name = chat_name_of(str(query.get("message", "")))
        out.append(_envelope(events.chat_start(name), chat_id, run_id, ts))
    out.append(_envelope(events.run_start(str(query.get("agentKey", ""))), chat_id, run_id, ts))
    return out


def _step_events(record: Record, chat_id: str, run_id: str) -> list[tuple[int | None, Event]]:
    """The events of a step (its terminal event aside), with their positions in the run.

    A step without `_order` has none (None): its events follow each other, its kept
    events placed among the message-derived ones by their `_at`.
    """
    task_id = str(record.get("taskId") or "")
    derived: list[Event] = []
    for message in record.get("messages") or []:
        derived.extend(_message_events(message, chat_id, run_id, task_id))
    order = record.get("_order")
    if isinstance(order, list):
        positions = [int(p) if isinstance(p, int) else -1 for p in order]
        positions += [-1] * (len(derived) - len(positions))
        placed: list[tuple[int | None, Event]] = list(zip(positions, derived, strict=False))
        for stored in record.get("_events") or []:
            placed.append((int(stored.get("_pos", -1)), _kept_event(stored, chat_id, run_id)))
        return placed
    out: list[Event] = []
    kept = sorted(record.get("_events") or [], key=lambda e: int(e.get("_at", 0)))
    position = 0
    for stored in kept:
        at = int(stored.get("_at", 0))
        out.extend(derived[position:at])
        position = max(position, at)
        out.append(_kept_event(stored, chat_id, run_id))
    out.extend(derived[position:])
    return [(None, event) for event in out]


def _kept_event(stored: Record, chat_id: str, run_id: str) -> Event:
    event = Event()
    data = {k: v for k, v in stored.items() if k not in ("_at", "_pos")}
    json_format.ParseDict(data, event, ignore_unknown_fields=True)
    event.chat_id, event.run_id = chat_id, run_id
    return event


def _text(parts: Any) -> str:
    if isinstance(parts, list):
        return "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))
    return str(parts or "")


def _message_events(message: Record, chat_id: str, run_id: str, task_id: str) -> list[Event]:
    ts = int(message.get("ts") or 0)
    role = message.get("role")
    if role == "assistant" and "reasoning_content" in message:
        snap = events.Event(
            reasoning_snapshot=pb.ReasoningSnapshot(
                reasoning_id=str(message.get("_reasoningId", "")),
                text=_text(message["reasoning_content"]),
            )
        )
        return [_envelope(snap, chat_id, run_id, ts, task_id)]
    if role == "assistant" and message.get("tool_calls"):
        out = []
        for call in message["tool_calls"]:
            function = call.get("function") or {}
            if "_actionId" in message:
                snap = events.Event(
                    action_snapshot=pb.ActionSnapshot(
                        action_id=str(message["_actionId"]),
                        action_name=str(function.get("name", "")),
                        description=str(message.get("_description", "")),
                        arguments=str(function.get("arguments", "")),
                    )
                )
            else:
                snap = events.Event(
                    tool_snapshot=pb.ToolSnapshot(
                        tool_id=str(message.get("_toolId") or call.get("id", "")),
                        tool_name=str(function.get("name", "")),
                        tool_type=str(message.get("_toolType", "")),
                        description=str(message.get("_description", "")),
                        arguments=str(function.get("arguments", "")),
                    )
                )
            out.append(_envelope(snap, chat_id, run_id, ts, task_id))
        return out
    if role == "assistant" and "content" in message:
        snap = events.Event(
            content_snapshot=pb.ContentSnapshot(
                content_id=str(message.get("_contentId", "")), text=_text(message["content"])
            )
        )
        return [_envelope(snap, chat_id, run_id, ts, task_id)]
    if role == "tool":
        text = _text(message.get("content"))
        value: Any = json.loads(text) if message.get("_json") else text
        if "_actionId" in message:
            result = events.Event(
                action_result=pb.ActionResult(
                    action_id=str(message["_actionId"]), result=events.to_value(value)
                )
            )
        else:
            result = events.tool_result(
                str(message.get("_toolId") or message.get("tool_call_id", "")),
                value,
                error=bool(message.get("_error")),
                cached=bool(message.get("_cached")),
                rendered_arguments=str(message.get("_renderedArguments", "")),
            )
        return [_envelope(result, chat_id, run_id, ts, task_id)]
    return []
