"""One agw run seen as an A2A task: agw events in, A2A stream updates out.

`TaskFold.apply` takes the run's events one by one (live deltas from `Query` or
`Attach`, or the snapshot form `GetChat` replays) and returns the A2A updates
each one makes, at once and without merging — the task is `runId`, its
context `chatId`:

* `request.query` → the `Task`, `submitted`, the user's message in its history;
* `run.start` → status `working`;
* `content.delta` → artifact update: the delta as a text part (`append` after
  the block's first delta);
* `content.end` → artifact update: the block's whole text, `append: false`,
  `lastChunk: true`;
* a frontend tool's `tool.end`, `question.ask`, `permission.ask`,
  `plan.approval` → status `input-required`: the question as a text part, what
  it waits for (`waitId`, ...) as a data part;
* `file.create` / `file.update` (a tool wrote a file in the chat's workspace) → an
  artifact update: one artifact per file (id `file:{path}`, its name the path), a file
  part whose url downloads it (`DownloadFile` over HTTP, on the host the client called:
  `FILES_BASE`), restated whole at each change;
* `run.complete` / `run.error` / `run.cancel` → status `completed` / `failed` /
  `canceled`;
* `heartbeat` → nothing;
* anything else (reasoning, tool calls, plans, usage, a subagent's events) →
  a status update in the current state whose message's data part is the agw
  event, as the SSE API sends it (`metadata.agwType` names it).

Each answer block (`contentId`) is one artifact named "answer". Its deltas
stream as parts appended to it; at the block's end it is restated whole, so a
client that folds parts (one per delta) ends with the answer as one text part.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from agw.v1 import events_pb2 as pb
from google.protobuf import json_format

from service.gateway import codec
from service.gateway.a2a.dialect import (
    CANCELED,
    COMPLETED,
    FAILED,
    INPUT_REQUIRED,
    ROLE_AGENT,
    ROLE_USER,
    SUBMITTED,
    TERMINAL_STATES,
    WORKING,
    Update,
)

#: The base of the files' download URLs ("https://host"): set per request by the endpoint,
#: from the scheme and host the client called; empty: the URLs are relative.
FILES_BASE: ContextVar[str] = ContextVar("a2a_files_base", default="")
#: `tool.start` types of frontend tools, whose calls wait for the user ("client": a tool the
#: query declared).
FRONTEND_TYPES = frozenset({"html", "qlc", "dqlc", "client"})
ARTIFACT_NAME = "answer"


@dataclass(slots=True)
class Wait:
    """Something the run waits for through Submit: its id, and how to ask the user."""

    wait_id: str
    kind: str  # "tool", "question", "permission" or "approval"
    prompt: str
    data: dict[str, Any]


@dataclass(slots=True)
class _Call:
    name: str = ""
    view_type: str = ""
    description: str = ""
    arguments: str = ""


class TaskFold:
    """The A2A task a run's events build, and the updates each event makes."""

    def __init__(self, user_message: dict[str, Any] | None = None) -> None:
        self.task_id = ""
        self.context_id = ""
        self.state = SUBMITTED
        self.timestamp = ""
        self.status_message: dict[str, Any] | None = None
        self.agent_key = ""
        self.history: list[dict[str, Any]] = []
        self.waits: dict[str, Wait] = {}  # pending, by id, in the order they opened
        self.opened: Wait | None = None  # the wait the latest event opened
        self._user_message = user_message
        self._blocks: dict[str, list[str]] = {}  # contentId → its text pieces, in order
        self._files: dict[str, dict[str, Any]] = {}  # path → its artifact, of the files written
        self._calls: dict[str, _Call] = {}

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES

    # -- the task ---------------------------------------------------------------------

    def task(self) -> dict[str, Any]:
        """The task as it stands (1.0 form)."""
        out: dict[str, Any] = {"id": self.task_id, "contextId": self.context_id}
        out["status"] = self._status()
        artifacts = [self._artifact(cid, "".join(text)) for cid, text in self._blocks.items()]
        artifacts += self._files.values()
        if artifacts:
            out["artifacts"] = artifacts
        if self.history:
            out["history"] = list(self.history)
        if self.agent_key:
            out["metadata"] = {"agentKey": self.agent_key}
        return out

    def resume(self) -> None:
        """The client answered the open wait: the task works again."""
        self.state, self.status_message, self.opened = WORKING, None, None

    # -- events -----------------------------------------------------------------------

    def apply(self, event: pb.Event) -> list[Update]:
        """The updates `event` makes (1.0 form), the task updated."""
        self.opened = None
        kind = event.WhichOneof("payload")
        if kind == "heartbeat":
            return []
        if event.timestamp:
            self.timestamp = iso_time(event.timestamp)
        if event.parent_tool_id:  # a subagent's run: details of the call that started it
            return [self._detail(event)]
        handler = _HANDLERS.get(kind or "")
        return handler(self, event) if handler is not None else [self._detail(event)]

    def _request_query(self, event: pb.Event) -> list[Update]:
        query = event.request_query
        self.task_id, self.context_id = event.run_id, event.chat_id
        message = self._user_message or {
            "messageId": query.request_id or f"{event.run_id}-query",
            "role": ROLE_USER,
            "parts": [{"text": query.message}],
        }
        self.history.append({**message, "contextId": self.context_id, "taskId": self.task_id})
        self.agent_key = query.agent_key
        return [("task", self.task())]

    def _run_start(self, event: pb.Event) -> list[Update]:
        self.state = WORKING
        return [self._status_update()]

    def _content_start(self, event: pb.Event) -> list[Update]:
        self._blocks.setdefault(event.content_start.content_id, [])
        return []

    def _content_delta(self, event: pb.Event) -> list[Update]:
        delta = event.content_delta
        pieces = self._blocks.setdefault(delta.content_id, [])
        append = bool(pieces)
        pieces.append(delta.delta)
        artifact = self._artifact(delta.content_id, delta.delta)
        return [self._artifact_update(artifact, append=append, last=False)]

    def _content_end(self, event: pb.Event) -> list[Update]:
        content_id = event.content_end.content_id
        text = "".join(self._blocks.setdefault(content_id, []))
        return [self._artifact_update(self._artifact(content_id, text), append=False, last=True)]

    def _content_snapshot(self, event: pb.Event) -> list[Update]:
        snapshot = event.content_snapshot
        self._blocks[snapshot.content_id] = [snapshot.text]
        artifact = self._artifact(snapshot.content_id, snapshot.text)
        return [self._artifact_update(artifact, append=False, last=True)]

    def _tool_start(self, event: pb.Event) -> list[Update]:
        start = event.tool_start
        self._calls[start.tool_id] = _Call(start.tool_name, start.tool_type, start.description)
        return [self._detail(event)]

    def _tool_args(self, event: pb.Event) -> list[Update]:
        call = self._calls.setdefault(event.tool_args.tool_id, _Call())
        call.arguments += event.tool_args.delta
        return [self._detail(event)]

    def _tool_end(self, event: pb.Event) -> list[Update]:
        tool_id = event.tool_end.tool_id
        call = self._calls.get(tool_id)
        if call is None or call.view_type not in FRONTEND_TYPES:
            return [self._detail(event)]
        return [self._wait(_frontend_wait(tool_id, call))]

    def _tool_snapshot(self, event: pb.Event) -> list[Update]:
        snapshot = event.tool_snapshot
        call = _Call(snapshot.tool_name, snapshot.tool_type, snapshot.description)
        call.arguments = snapshot.arguments
        self._calls[snapshot.tool_id] = call
        if call.view_type in FRONTEND_TYPES:
            self.waits[snapshot.tool_id] = _frontend_wait(snapshot.tool_id, call)
        return [self._detail(event)]

    def _tool_result(self, event: pb.Event) -> list[Update]:
        self._answered(event.tool_result.tool_id)
        return [self._detail(event)]

    def _file_written(self, event: pb.Event) -> list[Update]:
        file = event.file_create if event.HasField("file_create") else event.file_update
        url = f"{FILES_BASE.get()}/api/chats/{quote(event.chat_id, safe='')}/files/"
        part = {
            "url": url + quote(file.path, safe="/"),
            "filename": file.path.rsplit("/", 1)[-1],
            "mediaType": file.mime_type,
        }
        artifact = {
            "artifactId": f"file:{file.path}",
            "name": file.path,
            "parts": [part],
            "metadata": {"sizeBytes": file.size_bytes, "toolId": file.tool_id},
        }
        self._files[file.path] = artifact
        return [self._artifact_update(artifact, append=False, last=True)]

    def _question_ask(self, event: pb.Event) -> list[Update]:
        ask = event.question_ask
        lines = [ask.question, *(f"- {option}" for option in ask.options)]
        data: dict[str, Any] = {"question": ask.question, "options": list(ask.options)}
        if ask.multi_select:
            data["multiSelect"] = True
        if ask.allow_free_text:
            data["allowFreeText"] = True
        return [self._wait(Wait(ask.question_id, "question", "\n".join(lines), data))]

    def _permission_ask(self, event: pb.Event) -> list[Update]:
        ask = event.permission_ask
        prompt = f"May {ask.tool_name} run with {ask.arguments}? Answer true or false."
        data = {"toolId": ask.tool_id, "toolName": ask.tool_name, "arguments": ask.arguments}
        return [self._wait(Wait(ask.permission_id, "permission", prompt, data))]

    def _plan_approval(self, event: pb.Event) -> list[Update]:
        approval = event.plan_approval
        tasks = [t.description for t in approval.plan.tasks]
        prompt = "\n".join(["Approve this plan? Answer true or false.", *(f"- {t}" for t in tasks)])
        data = {"planId": approval.plan_id, "tasks": tasks}
        return [self._wait(Wait(approval.approval_id, "approval", prompt, data))]

    def _request_submit(self, event: pb.Event) -> list[Update]:
        submit = event.request_submit
        self._answered(submit.tool_id)
        payload = json_format.MessageToDict(submit.payload)
        self.history.append(
            {
                "messageId": submit.request_id or f"{event.run_id}-{event.seq}",
                "role": ROLE_USER,
                "parts": [{"data": payload}],
                "contextId": self.context_id,
                "taskId": self.task_id,
            }
        )
        if self.state == INPUT_REQUIRED and not self.waits:
            self.state, self.status_message = WORKING, None
        return [self._detail(event)]

    def _question_answer(self, event: pb.Event) -> list[Update]:
        self._answered(event.question_answer.question_id)
        return [self._detail(event)]

    def _permission_answer(self, event: pb.Event) -> list[Update]:
        self._answered(event.permission_answer.permission_id)
        return [self._detail(event)]

    def _run_complete(self, event: pb.Event) -> list[Update]:
        complete = event.run_complete
        metadata: dict[str, Any] = {"finishReason": complete.finish_reason}
        if complete.HasField("usage"):
            metadata["usage"] = codec.to_dict(complete.usage)
        return [self._end(COMPLETED, metadata)]

    def _run_error(self, event: pb.Event) -> list[Update]:
        error = event.run_error.error
        detail: dict[str, Any] = {"reason": error.reason, "message": error.message}
        if error.metadata:
            detail["metadata"] = dict(error.metadata)
        self.status_message = self._agent_message(event, [{"text": error.message}])
        return [self._end(FAILED, {"error": detail})]

    def _run_cancel(self, event: pb.Event) -> list[Update]:
        return [self._end(CANCELED, {"reason": event.run_cancel.reason})]

    # -- building blocks --------------------------------------------------------------

    def _end(self, state: str, metadata: dict[str, Any]) -> Update:
        self.state = state
        self.waits.clear()
        if state != FAILED:
            self.status_message = None
        return self._status_update(metadata)

    def _wait(self, wait: Wait) -> Update:
        self.waits[wait.wait_id] = wait
        self.opened = wait
        self.state = INPUT_REQUIRED
        data = {"waitId": wait.wait_id, "waitType": wait.kind, **wait.data}
        self.status_message = {
            "messageId": f"{self.task_id}-{wait.wait_id}",
            "role": ROLE_AGENT,
            "parts": [{"text": wait.prompt}, {"data": data}],
            "contextId": self.context_id,
            "taskId": self.task_id,
        }
        return self._status_update()

    def _answered(self, wait_id: str) -> None:
        self.waits.pop(wait_id, None)

    def _detail(self, event: pb.Event) -> Update:
        """A status update in the current state carrying the agw event itself."""
        message = self._agent_message(event, [{"data": codec.to_dict(event)}])
        message["metadata"] = {"agwType": event.type}
        body = self._status_body()
        body["status"] = {"state": self._shown_state(), "message": message}
        if self.timestamp:
            body["status"]["timestamp"] = self.timestamp
        return ("statusUpdate", body)

    def _agent_message(self, event: pb.Event, parts: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "messageId": f"{self.task_id or event.run_id}-{event.seq}",
            "role": ROLE_AGENT,
            "parts": parts,
            "contextId": self.context_id or event.chat_id,
            "taskId": self.task_id or event.run_id,
        }

    def _shown_state(self) -> str:
        # An event other than the wait itself while a wait is open: the run goes on meanwhile.
        return WORKING if self.state == INPUT_REQUIRED else self.state

    def _status_update(self, metadata: dict[str, Any] | None = None) -> Update:
        body = self._status_body()
        body["status"] = self._status()
        if metadata:
            body["metadata"] = metadata
        return ("statusUpdate", body)

    def _status_body(self) -> dict[str, Any]:
        return {"taskId": self.task_id, "contextId": self.context_id}

    def _status(self) -> dict[str, Any]:
        status: dict[str, Any] = {"state": self.state}
        if self.status_message is not None:
            status["message"] = self.status_message
        if self.timestamp:
            status["timestamp"] = self.timestamp
        return status

    def _artifact(self, content_id: str, text: str) -> dict[str, Any]:
        return {"artifactId": content_id, "name": ARTIFACT_NAME, "parts": [{"text": text}]}

    def _artifact_update(self, artifact: dict[str, Any], *, append: bool, last: bool) -> Update:
        body = self._status_body()
        body.update(artifact=artifact, append=append, lastChunk=last)
        return ("artifactUpdate", body)


_HANDLERS: dict[str, Callable[[TaskFold, pb.Event], list[Update]]] = {
    "request_query": TaskFold._request_query,
    "run_start": TaskFold._run_start,
    "content_start": TaskFold._content_start,
    "content_delta": TaskFold._content_delta,
    "content_end": TaskFold._content_end,
    "content_snapshot": TaskFold._content_snapshot,
    "tool_start": TaskFold._tool_start,
    "tool_args": TaskFold._tool_args,
    "tool_end": TaskFold._tool_end,
    "tool_snapshot": TaskFold._tool_snapshot,
    "tool_result": TaskFold._tool_result,
    "file_create": TaskFold._file_written,
    "file_update": TaskFold._file_written,
    "question_ask": TaskFold._question_ask,
    "question_answer": TaskFold._question_answer,
    "permission_ask": TaskFold._permission_ask,
    "permission_answer": TaskFold._permission_answer,
    "plan_approval": TaskFold._plan_approval,
    "request_submit": TaskFold._request_submit,
    "run_complete": TaskFold._run_complete,
    "run_error": TaskFold._run_error,
    "run_cancel": TaskFold._run_cancel,
}


def _frontend_wait(tool_id: str, call: _Call) -> Wait:
    """A frontend tool's call as a question: its `question` argument, else its name."""
    try:
        arguments: Any = json.loads(call.arguments) if call.arguments else {}
    except ValueError:
        arguments = call.arguments
    question = arguments.get("question") if isinstance(arguments, dict) else None
    if isinstance(question, str) and question:
        prompt = question
    else:
        prompt = f"{call.name} waits for your answer"
    data = {"toolName": call.name, "toolType": call.view_type, "arguments": arguments}
    if call.description:
        data["description"] = call.description
    return Wait(tool_id, "tool", prompt, data)


def iso_time(ms: int) -> str:
    """Milliseconds since the epoch as RFC 3339 in UTC, e.g. "2025-03-01T04:30:00.000Z"."""
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
