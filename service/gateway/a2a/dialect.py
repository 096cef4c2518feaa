"""The two wire forms of A2A's JSON-RPC binding: 1.0 and 0.3.

The endpoint builds tasks, messages and updates in the 1.0 form (the proto
JSON of `lf.a2a.v1`: `"state": "TASK_STATE_WORKING"`, `"role": "ROLE_AGENT"`,
parts `{"text": ...}` / `{"data": ...}` / `{"url": ...}`, stream results wrapped
as `{"statusUpdate": {...}}`). A `Dialect` reads a request's message in its form
and writes results in its form: `V1` as they are, `V03` with the 0.3 `kind`
discriminators (`"kind": "status-update"`, `"final": true`, ...), lower-case
state and role names and `file` parts. A request's method name says its dialect:
`SendStreamingMessage` is 1.0, `message/stream` is 0.3.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from service.gateway.a2a.jsonrpc import (
    CONTENT_TYPE_NOT_SUPPORTED,
    EXTENDED_CARD_NOT_CONFIGURED,
    UNSUPPORTED_OPERATION,
    RpcError,
    params_error,
)
from service.gateway.a2a.push import PUSH_DELETE, PUSH_GET, PUSH_LIST, PUSH_SET

#: Operations of the endpoint, named by what they do.
SEND, STREAM, GET, CANCEL, SUBSCRIBE = "send", "stream", "get", "cancel", "subscribe"

SUBMITTED = "TASK_STATE_SUBMITTED"
WORKING = "TASK_STATE_WORKING"
INPUT_REQUIRED = "TASK_STATE_INPUT_REQUIRED"
COMPLETED = "TASK_STATE_COMPLETED"
FAILED = "TASK_STATE_FAILED"
CANCELED = "TASK_STATE_CANCELED"
TERMINAL_STATES = frozenset({COMPLETED, FAILED, CANCELED})
#: States that end a stream: the task is done, or waits for the client.
FINAL_STATES = TERMINAL_STATES | {INPUT_REQUIRED}
ROLE_USER, ROLE_AGENT = "ROLE_USER", "ROLE_AGENT"

#: Stream results: (kind, body), kind one of "task", "message", "statusUpdate", "artifactUpdate".
Update = tuple[str, dict[str, Any]]


@dataclass(slots=True)
class UserMessage:
    """A client's message, read from either form; `wire` is its 1.0 form."""

    message_id: str
    context_id: str
    task_id: str
    text: str
    data: list[Any] = field(default_factory=list)
    urls: list[dict[str, str]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    wire: dict[str, Any] = field(default_factory=dict)


class Dialect:
    """One wire form: method names, how messages are read, how results are written."""

    version: ClassVar[str] = ""
    methods: ClassVar[dict[str, str]] = {}
    #: Methods of the protocol this endpoint does not offer → the A2A error code.
    unsupported: ClassVar[dict[str, int]] = {}
    user_roles: ClassVar[tuple[str, ...]] = ()

    def message_of(self, params: dict[str, Any]) -> UserMessage:
        """The `message` of send/stream params; `RpcError` (-32602) when malformed."""
        message = params.get("message")
        if not isinstance(message, dict):
            raise params_error("params.message must be an object")
        role = message.get("role")
        if role not in self.user_roles:
            raise params_error(f"message.role must be the user's ({self.user_roles[0]!r})")
        parts = message.get("parts")
        if not isinstance(parts, list) or not parts:
            raise params_error("message.parts must be a non-empty list")
        out = UserMessage(
            message_id=_text_field(message, "messageId", required=True),
            context_id=_text_field(message, "contextId"),
            task_id=_text_field(message, "taskId"),
            text="",
        )
        metadata = message.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise params_error("message.metadata must be an object")
        out.metadata = metadata or {}
        texts: list[str] = []
        wire_parts = [self._read_part(part, index, texts, out) for index, part in enumerate(parts)]
        out.text = "\n".join(texts)
        out.wire = {"messageId": out.message_id, "role": ROLE_USER, "parts": wire_parts}
        if out.metadata:
            out.wire["metadata"] = out.metadata
        return out

    def _read_part(
        self, part: Any, index: int, texts: list[str], out: UserMessage
    ) -> dict[str, Any]:
        raise NotImplementedError

    def stream_result(self, update: Update) -> dict[str, Any]:
        raise NotImplementedError

    def send_result(self, task: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def task(self, task: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError


class V1(Dialect):
    """A2A 1.0: proto JSON of `lf.a2a.v1`."""

    version: ClassVar[str] = "1.0"
    methods: ClassVar[dict[str, str]] = {
        "SendMessage": SEND,
        "SendStreamingMessage": STREAM,
        "GetTask": GET,
        "CancelTask": CANCEL,
        "SubscribeToTask": SUBSCRIBE,
        "CreateTaskPushNotificationConfig": PUSH_SET,
        "GetTaskPushNotificationConfig": PUSH_GET,
        "ListTaskPushNotificationConfigs": PUSH_LIST,
        "DeleteTaskPushNotificationConfig": PUSH_DELETE,
    }
    unsupported: ClassVar[dict[str, int]] = {
        "ListTasks": UNSUPPORTED_OPERATION,
        "GetExtendedAgentCard": EXTENDED_CARD_NOT_CONFIGURED,
    }
    user_roles: ClassVar[tuple[str, ...]] = (ROLE_USER, "user")

    def _read_part(
        self, part: Any, index: int, texts: list[str], out: UserMessage
    ) -> dict[str, Any]:
        if not isinstance(part, dict):
            raise params_error(f"message.parts[{index}] must be an object")
        wire = {k: part[k] for k in ("metadata", "filename", "mediaType") if k in part}
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
            return {"text": part["text"], **wire}
        if "data" in part:
            out.data.append(part["data"])
            return {"data": part["data"], **wire}
        if isinstance(part.get("url"), str):
            out.urls.append(
                {
                    "url": part["url"],
                    "name": str(part.get("filename", "")),
                    "mimeType": str(part.get("mediaType", "")),
                }
            )
            return {"url": part["url"], **wire}
        if "raw" in part:
            raise _no_raw(index)
        raise params_error(f"message.parts[{index}] has no text, data or url")

    def stream_result(self, update: Update) -> dict[str, Any]:
        kind, body = update
        return {kind: body}

    def send_result(self, task: dict[str, Any]) -> dict[str, Any]:
        return {"task": task}

    def task(self, task: dict[str, Any]) -> dict[str, Any]:
        return task


class V03(Dialect):
    """A2A 0.3: objects with `kind` discriminators, lower-case states and roles."""

    version: ClassVar[str] = "0.3"
    methods: ClassVar[dict[str, str]] = {
        "message/send": SEND,
        "message/stream": STREAM,
        "tasks/get": GET,
        "tasks/cancel": CANCEL,
        "tasks/resubscribe": SUBSCRIBE,
        "tasks/pushNotificationConfig/set": PUSH_SET,
        "tasks/pushNotificationConfig/get": PUSH_GET,
        "tasks/pushNotificationConfig/list": PUSH_LIST,
        "tasks/pushNotificationConfig/delete": PUSH_DELETE,
    }
    unsupported: ClassVar[dict[str, int]] = {
        "agent/getAuthenticatedExtendedCard": EXTENDED_CARD_NOT_CONFIGURED,
    }
    user_roles: ClassVar[tuple[str, ...]] = ("user",)

    def _read_part(
        self, part: Any, index: int, texts: list[str], out: UserMessage
    ) -> dict[str, Any]:
        if not isinstance(part, dict):
            raise params_error(f"message.parts[{index}] must be an object")
        kind = part.get("kind")
        wire = {"metadata": part["metadata"]} if isinstance(part.get("metadata"), dict) else {}
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
            return {"text": part["text"], **wire}
        if kind == "data" and isinstance(part.get("data"), dict):
            out.data.append(part["data"])
            return {"data": part["data"], **wire}
        if kind == "file" and isinstance(part.get("file"), dict):
            file = part["file"]
            if not isinstance(file.get("uri"), str):
                raise _no_raw(index)
            name, mime = str(file.get("name") or ""), str(file.get("mimeType") or "")
            out.urls.append({"url": file["uri"], "name": name, "mimeType": mime})
            return {"url": file["uri"], "filename": name, "mediaType": mime, **wire}
        raise params_error(f"message.parts[{index}] is not a text, data or file part")

    def stream_result(self, update: Update) -> dict[str, Any]:
        kind, body = update
        if kind == "task":
            return _task03(body)
        if kind == "message":
            return _message03(body)
        if kind == "statusUpdate":
            state = body["status"]["state"]
            out = {**body, "kind": "status-update", "status": _status03(body["status"])}
            out["final"] = state in FINAL_STATES
            return out
        return {**body, "kind": "artifact-update", "artifact": _artifact03(body["artifact"])}

    def send_result(self, task: dict[str, Any]) -> dict[str, Any]:
        return _task03(task)

    def task(self, task: dict[str, Any]) -> dict[str, Any]:
        return _task03(task)


DIALECTS: tuple[Dialect, ...] = (V1(), V03())


def dialect_of(method: str) -> Dialect | None:
    """The dialect whose method (supported or not) `method` is."""
    for dialect in DIALECTS:
        if method in dialect.methods or method in dialect.unsupported:
            return dialect
    return None


def _text_field(message: dict[str, Any], name: str, *, required: bool = False) -> str:
    value = message.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise params_error(f"message.{name} must be a{' non-empty' if required else ''} string")
    return value


def _no_raw(index: int) -> RpcError:
    return RpcError(
        CONTENT_TYPE_NOT_SUPPORTED,
        f"message.parts[{index}]: inline file bytes are not supported; send a url",
    )


# -- 1.0 → 0.3 ---------------------------------------------------------------------------

_STATES_03 = {
    "TASK_STATE_SUBMITTED": "submitted",
    "TASK_STATE_WORKING": "working",
    "TASK_STATE_INPUT_REQUIRED": "input-required",
    "TASK_STATE_COMPLETED": "completed",
    "TASK_STATE_FAILED": "failed",
    "TASK_STATE_CANCELED": "canceled",
}
_ROLES_03 = {ROLE_USER: "user", ROLE_AGENT: "agent"}


def _task03(task: dict[str, Any]) -> dict[str, Any]:
    out = {**task, "kind": "task", "status": _status03(task["status"])}
    if "artifacts" in task:
        out["artifacts"] = [_artifact03(a) for a in task["artifacts"]]
    if "history" in task:
        out["history"] = [_message03(m) for m in task["history"]]
    return out


def _status03(status: dict[str, Any]) -> dict[str, Any]:
    out = {**status, "state": _STATES_03[status["state"]]}
    if "message" in status:
        out["message"] = _message03(status["message"])
    return out


def _message03(message: dict[str, Any]) -> dict[str, Any]:
    return {
        **message,
        "kind": "message",
        "role": _ROLES_03[message["role"]],
        "parts": [_part03(p) for p in message["parts"]],
    }


def _artifact03(artifact: dict[str, Any]) -> dict[str, Any]:
    return {**artifact, "parts": [_part03(p) for p in artifact["parts"]]}


def _part03(part: dict[str, Any]) -> dict[str, Any]:
    extra = {"metadata": part["metadata"]} if "metadata" in part else {}
    if "text" in part:
        return {"kind": "text", "text": part["text"], **extra}
    if "data" in part:
        data = part["data"]
        wrapped = data if isinstance(data, dict) else {"value": data}
        return {"kind": "data", "data": wrapped, **extra}
    file = {"uri": part["url"]}
    if part.get("filename"):
        file["name"] = part["filename"]
    if part.get("mediaType"):
        file["mimeType"] = part["mediaType"]
    return {"kind": "file", "file": file, **extra}
