"""agw events projected onto AG-UI events (the AG-UI protocol, 1.0).

A `Projection` follows one agw run and turns each of its events into the AG-UI
events that say the same thing, as camelCase JSON objects ready to send:

- the run's first event: `RUN_STARTED` (its `metadata.agw` names the chat and run);
- `reasoning.start` / `.delta` / `.end`: `REASONING_START` + `REASONING_MESSAGE_START` /
  `REASONING_MESSAGE_CONTENT` / `REASONING_MESSAGE_END` + `REASONING_END`;
- `content.start` / `.delta` / `.end`: `TEXT_MESSAGE_START` / `_CONTENT` / `_END`;
- `tool.*` and `action.*` (start, args, end, result): `TOOL_CALL_START` / `_ARGS` / `_END` /
  `TOOL_CALL_RESULT` (the result as text: a string, else its JSON);
- `plan.create`: `STATE_SNAPSHOT` with the plan under `plan`; `plan.update` and
  `plan.revise`: `STATE_DELTA`, a JSON Patch of it;
- `task.start`: `STEP_STARTED`; `task.complete`, `task.fail`: `STEP_FINISHED` (the step's
  name is the task id);
- events of a subagent's nested run: attributed with `subagentRunId` (the id of the tool
  call that runs it), between `SUBAGENT_STARTED` and `SUBAGENT_FINISHED`;
- `run.complete`: `RUN_FINISHED` (with the run's token usage); `run.cancel`:
  `RUN_FINISHED` with outcome `cancelled`; `run.error`: `RUN_ERROR` (`code`: its reason);
- any other event (`request.query`, `chat.start`, `run.start`, `request.submit`,
  `source.snapshot`, `usage.update`, ...): `CUSTOM`, named by the agw type, its value
  the payload's fields;
- `heartbeat`: nothing (the SSE stream has its own heartbeat comments).

One agw delta is one AG-UI event, produced at once. A run whose only open tool
calls are frontend tools waiting for the user *blocks*: the projection then
ends the AG-UI run with `RUN_FINISHED` (outcome `success`, the calls in
`pendingToolCallIds`), while the agw run goes on waiting; a later AG-UI run
that answers them continues the same projection (`resume`). A run waiting for
asks (`permission.ask`, `question.ask`, `plan.approval`, each also a `CUSTOM`
event) ends the AG-UI run the same way, with outcome `interrupt`. Before any
`RUN_FINISHED`, open steps and subagents are closed, as AG-UI requires.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from agw.v1 import events_pb2 as pb

from service.gateway import codec

AgUiEvent = dict[str, Any]

#: `tool.start` types of tools executed by the service (the others are frontend views).
SERVICE_TOOL_TYPES = frozenset({"", "backend"})
#: The state key under which the plan is kept.
PLAN_KEY = "plan"
_STATUS_PREFIX = "TASK_STATUS_"


@dataclass(slots=True)
class _Call:
    """A tool (or action) call of the run, as far as the stream has told."""

    name: str
    frontend: bool
    parent: str = ""  # the calling tool's id, for a call of a subagent's nested run
    ended: bool = False
    resolved: bool = False


@dataclass
class Projection:
    """The AG-UI view of one agw run, across the AG-UI runs that follow it."""

    thread_id: str
    run_id: str  # the current AG-UI run's id
    state: dict[str, Any] = field(default_factory=dict)  # the client's state, plan merged in
    agw_run_id: str = ""
    last_seq: int = 0
    started: bool = False
    finished: bool = False
    calls: dict[str, _Call] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)  # frontend calls answered through AG-UI
    steps: list[str] = field(default_factory=list)  # open steps (task ids), in start order
    subagents: dict[str, str] = field(default_factory=dict)  # open ones: tool id → name
    pending: list[str] = field(default_factory=list)  # frontend calls left to the client
    asks: dict[str, AgUiEvent] = field(default_factory=dict)  # open asks, as AG-UI interrupts
    # The thread's messages, sent once after RUN_STARTED (MESSAGES_SNAPSHOT), when it has any.
    snapshot: list[dict[str, Any]] | None = None

    # -- the run's life --------------------------------------------------------------------

    def resume(self, run_id: str, answered: list[str]) -> None:
        """Continue in a new AG-UI run `run_id`, the client having answered the tool calls
        and asks `answered`."""
        self.run_id = run_id
        self.started = self.finished = False
        self.answered.update(answered)
        self.pending = []

    @property
    def interrupts(self) -> list[AgUiEvent]:
        """The open asks the client has not answered yet."""
        return [ask for ask_id, ask in self.asks.items() if ask_id not in self.answered]

    def project(self, event: pb.Event) -> list[AgUiEvent]:
        """The AG-UI events for `event` (none for a heartbeat), in order."""
        kind = event.WhichOneof("payload")
        if kind == "heartbeat" or kind is None or self.finished:
            return []
        if event.seq:
            self.last_seq = event.seq
        out = [] if self.started else self._run_started(event)
        nested = event.parent_tool_id
        if nested and nested not in self.subagents:
            out.append(self._subagent_started(event, nested))
        handler = _HANDLERS.get(kind, Projection._custom)
        produced = handler(self, event, getattr(event, kind))
        if nested:
            for item in produced:
                if item["type"] in _ATTRIBUTABLE:
                    item["subagentRunId"] = nested
        out.extend(produced)
        outcome = None if self.finished else self._blocked()
        if outcome is not None:
            out.extend(self._finish(event, outcome=outcome))
        return out

    def _run_started(self, event: pb.Event) -> list[AgUiEvent]:
        """`RUN_STARTED`, then the steps a blocked AG-UI run left open, started again."""
        self.started = True
        self.agw_run_id = event.run_id
        self.thread_id = self.thread_id or event.chat_id
        started = _at(
            event,
            "RUN_STARTED",
            threadId=self.thread_id,
            runId=self.run_id,
            metadata={"agw": {"chatId": event.chat_id, "runId": event.run_id}},
        )
        out = [started]
        if self.snapshot is not None:
            out.append(_at(event, "MESSAGES_SNAPSHOT", messages=self.snapshot))
            self.snapshot = None
        return [*out, *(_at(event, "STEP_STARTED", stepName=step) for step in self.steps)]

    def _subagent_started(self, event: pb.Event, tool_id: str) -> AgUiEvent:
        call = self.calls.get(tool_id)
        self.subagents[tool_id] = call.name if call is not None else tool_id
        fields: dict[str, Any] = {"parentToolCallId": tool_id}
        if call is not None and call.parent:
            fields["parentSubagentRunId"] = call.parent
        return _at(
            event,
            "SUBAGENT_STARTED",
            subagentRunId=tool_id,
            name=self.subagents[tool_id],
            **fields,
        )

    def _blocked(self) -> AgUiEvent | None:
        """The outcome that ends the AG-UI run when the agw run can only wait for the client.

        That is when something waits for the client (a frontend call or an ask it has not
        answered) and every open call waits for the client too: an ended frontend call, a
        call whose permission is asked, a call whose nested calls are open, or as many
        other calls as there are open questions (a question is asked by a running tool).
        """
        unresolved = {call_id: c for call_id, c in self.calls.items() if not c.resolved}
        parents = {c.parent for c in unresolved.values()}
        frontend = [i for i, c in unresolved.items() if c.frontend and c.ended]
        asked = {ask.get("toolCallId") for ask in self.asks.values()}
        busy = [
            call_id
            for call_id, c in unresolved.items()
            if call_id not in frontend and call_id not in asked and call_id not in parents
        ]
        questions = sum(1 for ask in self.asks.values() if ask["reason"] == "question")
        self.pending = [call_id for call_id in frontend if call_id not in self.answered]
        interrupts = self.interrupts
        if len(busy) > questions or not (self.pending or interrupts):
            return None
        if interrupts:
            return {"type": "interrupt", "interrupts": interrupts}
        return {"type": "success", "pendingToolCallIds": self.pending}

    def _finish(self, event: pb.Event, **fields: Any) -> list[AgUiEvent]:
        """Close the open steps and subagents, then `RUN_FINISHED` with `fields`."""
        self.finished = True
        out = [_at(event, "STEP_FINISHED", stepName=step) for step in self.steps]
        out += [_at(event, "SUBAGENT_FINISHED", subagentRunId=s) for s in self.subagents]
        self.subagents.clear()
        out.append(_at(event, "RUN_FINISHED", threadId=self.thread_id, runId=self.run_id, **fields))
        return out

    # -- handlers, one per agw payload ---------------------------------------------------------

    def _reasoning_start(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        block = payload.reasoning_id
        return [
            _at(event, "REASONING_START", messageId=block),
            _at(event, "REASONING_MESSAGE_START", messageId=block, role="reasoning"),
        ]

    def _reasoning_delta(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        return [
            _at(
                event,
                "REASONING_MESSAGE_CONTENT",
                messageId=payload.reasoning_id,
                delta=payload.delta,
            )
        ]

    def _reasoning_end(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        block = payload.reasoning_id
        return [
            _at(event, "REASONING_MESSAGE_END", messageId=block),
            _at(event, "REASONING_END", messageId=block),
        ]

    def _content_start(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        return [_at(event, "TEXT_MESSAGE_START", messageId=payload.content_id, role="assistant")]

    def _content_delta(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        return [
            _at(event, "TEXT_MESSAGE_CONTENT", messageId=payload.content_id, delta=payload.delta)
        ]

    def _content_end(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        return [_at(event, "TEXT_MESSAGE_END", messageId=payload.content_id)]

    def _tool_start(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        frontend = payload.tool_type not in SERVICE_TOOL_TYPES
        self.calls[payload.tool_id] = _Call(payload.tool_name, frontend, event.parent_tool_id)
        return [
            _at(
                event, "TOOL_CALL_START", toolCallId=payload.tool_id, toolCallName=payload.tool_name
            )
        ]

    def _action_start(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        self.calls[payload.action_id] = _Call(payload.action_name, False, event.parent_tool_id)
        return [
            _at(
                event,
                "TOOL_CALL_START",
                toolCallId=payload.action_id,
                toolCallName=payload.action_name,
            )
        ]

    def _tool_args(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        return [_at(event, "TOOL_CALL_ARGS", toolCallId=payload.tool_id, delta=payload.delta)]

    def _action_args(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        return [_at(event, "TOOL_CALL_ARGS", toolCallId=payload.action_id, delta=payload.delta)]

    def _tool_end(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        return self._call_end(event, payload.tool_id)

    def _action_end(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        return self._call_end(event, payload.action_id)

    def _call_end(self, event: pb.Event, call_id: str) -> list[AgUiEvent]:
        if call_id in self.calls:
            self.calls[call_id].ended = True
        return [_at(event, "TOOL_CALL_END", toolCallId=call_id)]

    def _tool_result(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        return self._call_result(event, payload.tool_id, payload.result)

    def _action_result(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        return self._call_result(event, payload.action_id, payload.result)

    def _call_result(self, event: pb.Event, call_id: str, result: Any) -> list[AgUiEvent]:
        call = self.calls.get(call_id)
        if call is not None:
            call.resolved = True
        out: list[AgUiEvent] = []
        if call_id in self.subagents:
            del self.subagents[call_id]
            out.append(_at(event, "SUBAGENT_FINISHED", subagentRunId=call_id))
        if call_id in self.answered:  # the client sent this result itself: it has it
            return out
        text = result_text(result)
        out.append(
            _at(
                event,
                "TOOL_CALL_RESULT",
                messageId=f"{call_id}_result",
                toolCallId=call_id,
                content=text,
                role="tool",
            )
        )
        return out

    def _plan_create(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        self.state = {**self.state, PLAN_KEY: _plan(payload.plan_id, payload.plan)}
        return [_at(event, "STATE_SNAPSHOT", snapshot=self.state)]

    def _plan_change(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        new = _plan(payload.plan_id, payload.plan)
        old = self.state.get(PLAN_KEY)
        self.state = {**self.state, PLAN_KEY: new}
        operations = _plan_patch(old, new)
        return [_at(event, "STATE_DELTA", delta=operations)] if operations else []

    def _task_start(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        self.steps.append(event.task_id)
        return [_at(event, "STEP_STARTED", stepName=event.task_id)]

    def _task_end(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        if event.task_id not in self.steps:
            return []
        self.steps.remove(event.task_id)
        return [_at(event, "STEP_FINISHED", stepName=event.task_id)]

    def _run_complete(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        if event.parent_tool_id:
            return self._custom(event, payload)
        usage = _usage(payload.usage) if payload.HasField("usage") else None
        return self._finish(event, **({"usage": [usage]} if usage else {}))

    def _run_cancel(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        if event.parent_tool_id:
            return self._custom(event, payload)
        return self._finish(event, outcome={"type": "cancelled"})

    def _run_error(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        if event.parent_tool_id:
            return self._custom(event, payload)
        self.finished = True
        error = payload.error
        return [_at(event, "RUN_ERROR", message=error.message or error.reason, code=error.reason)]

    def _permission_ask(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        self._ask(
            event,
            payload,
            payload.permission_id,
            "permission",
            f"Allow the tool call {payload.tool_name}({payload.arguments})?",
            payload.timeout_ms,
            {"type": "boolean"},
            toolCallId=payload.tool_id,
        )
        return self._custom(event, payload)

    def _question_ask(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        answer: dict[str, Any] = {"type": "string"}
        if payload.options and not payload.allow_free_text:
            answer["enum"] = list(payload.options)
        schema = {"type": "array", "items": answer} if payload.multi_select else answer
        self._ask(
            event,
            payload,
            payload.question_id,
            "question",
            payload.question,
            payload.timeout_ms,
            schema,
        )
        return self._custom(event, payload)

    def _plan_approval(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        self._ask(
            event,
            payload,
            payload.approval_id,
            "plan_approval",
            "Approve the plan?",
            payload.timeout_ms,
            {"type": "boolean"},
        )
        return self._custom(event, payload)

    def _ask(
        self,
        event: pb.Event,
        payload: Any,
        ask_id: str,
        reason: str,
        message: str,
        timeout_ms: int,
        schema: dict[str, Any],
        **fields: Any,
    ) -> None:
        """Record an ask of the run as the AG-UI interrupt that answers it."""
        interrupt = {"id": ask_id, "reason": reason, "message": message, **fields}
        interrupt["responseSchema"] = schema
        if timeout_ms:
            interrupt["expiresAt"] = _iso(event.timestamp + timeout_ms)
        interrupt["metadata"] = {"agw": {"type": event.type, **codec.to_dict(payload)}}
        if event.parent_tool_id:
            interrupt["subagentRunId"] = event.parent_tool_id
        self.asks[ask_id] = interrupt

    def _answered(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        """An ask answered (or timed out): it no longer holds the run."""
        for key in ("tool_id", "permission_id", "question_id"):
            if key in payload.DESCRIPTOR.fields_by_name:
                self.asks.pop(getattr(payload, key), None)
        return self._custom(event, payload)

    def _custom(self, event: pb.Event, payload: Any) -> list[AgUiEvent]:
        return [_at(event, "CUSTOM", name=event.type, value=codec.to_dict(payload))]


def failed(projection: Projection, message: str, code: str, timestamp: int) -> list[AgUiEvent]:
    """The end of an AG-UI run whose agw stream failed or stopped without a terminal event."""
    out: list[AgUiEvent] = []
    if not projection.started:
        projection.started = True
        out.append(
            {
                "type": "RUN_STARTED",
                "timestamp": timestamp,
                "threadId": projection.thread_id,
                "runId": projection.run_id,
            }
        )
    projection.finished = True
    out.append({"type": "RUN_ERROR", "timestamp": timestamp, "message": message, "code": code})
    return out


def result_text(value: Any) -> str:
    """A tool's result as AG-UI's tool message content: a string, else its JSON."""
    content = codec.to_dict(pb.ToolResult(result=value)).get("result", "")
    return content if isinstance(content, str) else orjson.dumps(content).decode()


def _at(event: pb.Event, kind: str, **fields: Any) -> AgUiEvent:
    return {"type": kind, "timestamp": event.timestamp, **fields}


def _iso(milliseconds: int) -> str:
    """An instant as ISO 8601 in UTC, to the millisecond."""
    instant = datetime.fromtimestamp(milliseconds / 1000, tz=UTC)
    return instant.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _plan(plan_id: str, plan: pb.Plan) -> dict[str, Any]:
    return {
        "planId": plan_id,
        "tasks": [
            {
                "taskId": task.task_id,
                "description": task.description,
                "status": pb.TaskStatus.Name(task.status).removeprefix(_STATUS_PREFIX).lower(),
            }
            for task in plan.tasks
        ],
    }


def _plan_patch(old: Any, new: dict[str, Any]) -> list[dict[str, Any]]:
    """JSON Patch from the plan `old` to `new`: per-field replaces when the tasks are the
    same ones, else the whole plan."""
    path = f"/{PLAN_KEY}"
    if not isinstance(old, dict):
        return [{"op": "add", "path": path, "value": new}]
    old_tasks, new_tasks = old.get("tasks", []), new["tasks"]
    same = old.get("planId") == new["planId"] and [t["taskId"] for t in old_tasks] == [
        t["taskId"] for t in new_tasks
    ]
    if not same:
        return [{"op": "replace", "path": path, "value": new}]
    operations = []
    for index, (before, after) in enumerate(zip(old_tasks, new_tasks, strict=True)):
        for key in ("description", "status"):
            if before[key] != after[key]:
                operations.append(
                    {"op": "replace", "path": f"{path}/tasks/{index}/{key}", "value": after[key]}
                )
    return operations


def _usage(usage: pb.Usage) -> dict[str, int] | None:
    counts = {
        "inputTokens": usage.prompt_tokens,
        "outputTokens": usage.completion_tokens,
        "totalTokens": usage.total_tokens,
        "reasoningTokens": usage.reasoning_tokens,
        "cachedInputTokens": usage.cached_tokens,
    }
    kept = {key: value for key, value in counts.items() if value}
    return kept or None


#: AG-UI events that may carry `subagentRunId`.
_ATTRIBUTABLE = frozenset(
    {
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "STATE_SNAPSHOT",
        "STATE_DELTA",
        "STEP_STARTED",
        "STEP_FINISHED",
        "REASONING_START",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
        "REASONING_END",
        "CUSTOM",
    }
)

_HANDLERS = {
    "reasoning_start": Projection._reasoning_start,
    "reasoning_delta": Projection._reasoning_delta,
    "reasoning_end": Projection._reasoning_end,
    "content_start": Projection._content_start,
    "content_delta": Projection._content_delta,
    "content_end": Projection._content_end,
    "tool_start": Projection._tool_start,
    "tool_args": Projection._tool_args,
    "tool_end": Projection._tool_end,
    "tool_result": Projection._tool_result,
    "action_start": Projection._action_start,
    "action_args": Projection._action_args,
    "action_end": Projection._action_end,
    "action_result": Projection._action_result,
    "plan_create": Projection._plan_create,
    "plan_update": Projection._plan_change,
    "plan_revise": Projection._plan_change,
    "task_start": Projection._task_start,
    "task_complete": Projection._task_end,
    "task_fail": Projection._task_end,
    "run_complete": Projection._run_complete,
    "run_cancel": Projection._run_cancel,
    "run_error": Projection._run_error,
    "permission_ask": Projection._permission_ask,
    "question_ask": Projection._question_ask,
    "plan_approval": Projection._plan_approval,
    "request_submit": Projection._answered,
    "permission_answer": Projection._answered,
    "question_answer": Projection._answered,
}
