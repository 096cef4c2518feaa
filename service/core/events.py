"""Event constructors and the event-name table.

The core speaks the contract's own vocabulary: events are `agw.v1.Event`
messages. Constructors here build the payload; `EventLog.emit` fills the
envelope (seq, type, timestamp, ids). With `history.py`, this is the only core
module that imports generated code: the rest of the core builds events through
these functions (`make` for the variants without a dedicated one).

The dotted `type` of an event is derived from its oneof field name by one
rule — the first underscore becomes a dot (`content_delta` → `content.delta`) —
so the table cannot drift from the proto.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from agw.v1 import events_pb2 as pb
from google.protobuf import json_format, struct_pb2

Event = pb.Event

#: oneof field name → dotted event type, for every variant of the contract.
EVENT_TYPES: dict[str, str] = {
    f.name: f.name.replace("_", ".", 1)
    for f in pb.Event.DESCRIPTOR.oneofs_by_name["payload"].fields
}

#: start field → (end field, id field) of the blocks that must be closed.
BLOCKS: dict[str, tuple[str, str]] = {
    "reasoning_start": ("reasoning_end", "reasoning_id"),
    "content_start": ("content_end", "content_id"),
    "tool_start": ("tool_end", "tool_id"),
    "action_start": ("action_end", "action_id"),
}
#: end field → id field, to recognise the closing of an open block.
BLOCK_ENDS: dict[str, str] = {end: id_field for end, id_field in BLOCKS.values()}

TERMINALS = frozenset({"run_complete", "run_error", "run_cancel"})

#: oneof field name → its payload message class.
_PAYLOADS: dict[str, Any] = {
    f.name: getattr(pb, f.message_type.name)
    for f in pb.Event.DESCRIPTOR.oneofs_by_name["payload"].fields
    if f.message_type is not None
}

#: A plan task's status (the core's words) → the contract's enum value.
TASK_STATUS = {
    "init": pb.TASK_STATUS_INIT,
    "in_progress": pb.TASK_STATUS_IN_PROGRESS,
    "completed": pb.TASK_STATUS_COMPLETED,
    "failed": pb.TASK_STATUS_FAILED,
    "canceled": pb.TASK_STATUS_CANCELED,
}


def make(field: str, *, task_id: str = "", **fields: Any) -> Event:
    """An event of the variant named by its oneof `field` (e.g. "permission_ask")."""
    return Event(task_id=task_id, **{field: _PAYLOADS[field](**fields)})


def to_dict(message: Any) -> dict[str, Any]:
    """A message (an event or a payload) as JSON data with the contract's camelCase names."""
    data: dict[str, Any] = json_format.MessageToDict(message)
    return data


def from_value(value: struct_pb2.Value) -> Any:
    """A `google.protobuf.Value` as plain JSON data."""
    return json_format.MessageToDict(value)


def usage(value: Any) -> pb.Usage | None:
    """A `model.Usage` as the contract's `Usage` (None stays None)."""
    if value is None:
        return None
    return pb.Usage(
        prompt_tokens=value.prompt_tokens,
        completion_tokens=value.completion_tokens,
        total_tokens=value.total_tokens,
        reasoning_tokens=value.reasoning_tokens,
        cached_tokens=value.cached_tokens,
    )


def plan(tasks: list[tuple[str, str, str]]) -> pb.Plan:
    """A plan of (task id, description, status) tasks."""
    return pb.Plan(
        tasks=[
            pb.Task(task_id=task_id, description=description, status=TASK_STATUS[status])
            for task_id, description, status in tasks
        ],
    )


def to_value(value: Any) -> struct_pb2.Value:
    """A JSON-compatible Python value as a `google.protobuf.Value`."""
    out = struct_pb2.Value()
    json_format.ParseDict(value, out)
    return out


def to_struct(value: dict[str, Any] | None) -> struct_pb2.Struct | None:
    if value is None:
        return None
    out = struct_pb2.Struct()
    out.update(value)
    return out


# Input and chat ---------------------------------------------------------------


def request_query(
    request_id: str,
    *,
    role: str,
    message: str,
    agent_key: str,
    references: Sequence[Any] = (),
    params: dict[str, Any] | None = None,
    scene: dict[str, Any] | None = None,
    stream: bool = True,
) -> Event:
    """The `request.query` event of a query, as the run's first event (`references`:
    dataclasses with the fields of `Reference`)."""
    return Event(
        request_query=pb.RequestQuery(
            request_id=request_id,
            role=role or "user",
            message=message,
            agent_key=agent_key,
            references=[pb.Reference(**asdict(r)) for r in references],
            params=to_struct(params),
            scene=to_struct(scene),
            stream=stream,
        )
    )


def chat_start(chat_name: str) -> Event:
    return Event(chat_start=pb.ChatStart(chat_name=chat_name))


def chat_update(chat_name: str, *, request_id: str = "", previous_chat_name: str = "") -> Event:
    return Event(
        chat_update=pb.ChatUpdate(
            chat_name=chat_name, request_id=request_id, previous_chat_name=previous_chat_name
        )
    )


def request_submit(request_id: str, tool_id: str, payload: Any, *, view_id: str = "") -> Event:
    return Event(
        request_submit=pb.RequestSubmit(
            request_id=request_id, tool_id=tool_id, payload=to_value(payload), view_id=view_id
        )
    )


# Plan and tasks ---------------------------------------------------------------


def plan_create(plan_id: str, plan: pb.Plan) -> Event:
    return Event(plan_create=pb.PlanCreate(plan_id=plan_id, plan=plan))


def plan_update(plan_id: str, plan: pb.Plan) -> Event:
    return Event(plan_update=pb.PlanUpdate(plan_id=plan_id, plan=plan))


def task_start(task_id: str, description: str) -> Event:
    return Event(task_id=task_id, task_start=pb.TaskStart(description=description))


def task_complete(task_id: str, description: str) -> Event:
    return Event(task_id=task_id, task_complete=pb.TaskComplete(description=description))


def task_fail(task_id: str, reason: str, message: str) -> Event:
    return Event(
        task_id=task_id,
        task_fail=pb.TaskFail(error=pb.ErrorDetail(reason=reason, message=message)),
    )


# Run --------------------------------------------------------------------------


def run_start(agent_key: str) -> Event:
    return Event(run_start=pb.RunStart(agent_key=agent_key))


def run_complete(finish_reason: str, usage: pb.Usage | None = None) -> Event:
    return Event(run_complete=pb.RunComplete(finish_reason=finish_reason, usage=usage))


def run_resume(reason: str, step: str, replica: str, attempt: int) -> Event:
    return Event(
        run_resume=pb.RunResume(reason=reason, step=step, replica=replica, attempt=attempt)
    )


def run_cancel(reason: str) -> Event:
    return Event(run_cancel=pb.RunCancel(reason=reason))


def run_error(reason: str, message: str, metadata: dict[str, str] | None = None) -> Event:
    return Event(run_error=pb.RunError(error=error_detail(reason, message, metadata)))


def error_detail(reason: str, message: str, metadata: dict[str, str] | None = None) -> Any:
    """The contract's `ErrorDetail` (for the events that carry one)."""
    return pb.ErrorDetail(reason=reason, message=message, metadata=metadata or {})


# Reasoning and content --------------------------------------------------------
# These are on the per-delta path: the payload's fields are set in place, which costs a
# fraction of building the payload message first and then copying it into the event.


def reasoning_start(reasoning_id: str) -> Event:
    event = Event()
    event.reasoning_start.reasoning_id = reasoning_id
    return event


def reasoning_delta(reasoning_id: str, delta: str) -> Event:
    event = Event()
    payload = event.reasoning_delta
    payload.reasoning_id = reasoning_id
    payload.delta = delta
    return event


def reasoning_end(reasoning_id: str) -> Event:
    event = Event()
    event.reasoning_end.reasoning_id = reasoning_id
    return event


def content_start(content_id: str) -> Event:
    event = Event()
    event.content_start.content_id = content_id
    return event


def content_delta(content_id: str, delta: str) -> Event:
    event = Event()
    payload = event.content_delta
    payload.content_id = content_id
    payload.delta = delta
    return event


def content_end(content_id: str) -> Event:
    event = Event()
    event.content_end.content_id = content_id
    return event


# Tools ------------------------------------------------------------------------


def tool_start(tool_id: str, tool_name: str, tool_type: str = "backend", **extra: Any) -> Event:
    return Event(
        tool_start=pb.ToolStart(tool_id=tool_id, tool_name=tool_name, tool_type=tool_type, **extra)
    )


def tool_args(tool_id: str, delta: str, chunk_index: int) -> Event:
    event = Event()
    payload = event.tool_args
    payload.tool_id = tool_id
    payload.delta = delta
    payload.chunk_index = chunk_index
    return event


def tool_end(tool_id: str) -> Event:
    return Event(tool_end=pb.ToolEnd(tool_id=tool_id))


def tool_result(
    tool_id: str,
    result: Any,
    *,
    error: bool = False,
    cached: bool = False,
    rendered_arguments: str = "",
) -> Event:
    return Event(
        tool_result=pb.ToolResult(
            tool_id=tool_id,
            result=to_value(result),
            error=error,
            cached=cached,
            rendered_arguments=rendered_arguments,
        )
    )


def tool_progress(
    tool_id: str,
    message: str = "",
    *,
    progress: float | None = None,
    total: float | None = None,
    stream: str = "",
) -> Event:
    payload = pb.ToolProgress(tool_id=tool_id, message=message, stream=stream)
    if progress is not None:
        payload.progress = progress
    if total is not None:
        payload.total = total
    return Event(tool_progress=payload)


# Actions ----------------------------------------------------------------------


def action_start(action_id: str, action_name: str, description: str = "") -> Event:
    return Event(
        action_start=pb.ActionStart(
            action_id=action_id, action_name=action_name, description=description
        )
    )


def action_args(action_id: str, delta: str, chunk_index: int) -> Event:
    event = Event()
    payload = event.action_args
    payload.action_id = action_id
    payload.delta = delta
    payload.chunk_index = chunk_index
    return event


def action_end(action_id: str) -> Event:
    return Event(action_end=pb.ActionEnd(action_id=action_id))


def action_param(action_id: str, param: Any) -> Event:
    return Event(action_param=pb.ActionParam(action_id=action_id, param=to_value(param)))


def action_result(action_id: str, result: Any) -> Event:
    return Event(action_result=pb.ActionResult(action_id=action_id, result=to_value(result)))


def context_compress(
    strategy: str, messages_before: int, messages_after: int, tokens_before: int, tokens_after: int
) -> Event:
    return Event(
        context_compress=pb.ContextCompress(
            strategy=strategy,
            messages_before=messages_before,
            messages_after=messages_after,
            tokens_before=tokens_before,
            tokens_after=tokens_after,
        )
    )


def question_ask(
    question_id: str,
    question: str,
    options: list[tuple[str, str, bool]],
    *,
    timeout_ms: int,
    multi_select: bool = False,
    allow_free_text: bool = False,
) -> Event:
    """A question with (label, description, recommended) options: their labels in
    `options`, and the typed `choices` too when one of them is more than a label."""
    described = any(description or recommended for _, description, recommended in options)
    return Event(
        question_ask=pb.QuestionAsk(
            question_id=question_id,
            question=question,
            options=[label for label, _, _ in options],
            timeout_ms=timeout_ms,
            choices=[
                pb.QuestionOption(label=label, description=description, recommended=recommended)
                for label, description, recommended in (options if described else [])
            ],
            multi_select=multi_select,
            allow_free_text=allow_free_text,
        )
    )


def loop_detect(tool_name: str, arguments: str, repeat_count: int) -> Event:
    return Event(
        loop_detect=pb.LoopDetect(
            tool_name=tool_name, arguments=arguments, repeat_count=repeat_count
        )
    )


def end_of(start: Event) -> Event:
    """The `*.end` event that closes the block opened by `start`."""
    field = start.WhichOneof("payload")
    assert field in BLOCKS, field
    end_field, id_field = BLOCKS[field]
    end = Event()
    getattr(end, end_field).SetInParent()
    setattr(getattr(end, end_field), id_field, getattr(getattr(start, field), id_field))
    end.task_id = start.task_id
    end.parent_tool_id = start.parent_tool_id
    return end


def to_json(event: Event) -> str:
    """The event as compact JSON with the contract's camelCase names (for logs and tests)."""
    return json.dumps(json_format.MessageToDict(event), ensure_ascii=False, separators=(",", ":"))
