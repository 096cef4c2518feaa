"""What the transports ask of the core, in the core's own types.

The transports decode their requests (Protobuf, JSON) into these commands at
the edge (`service/transport/codec.py`); the front door (`service.core.frontdoor`)
takes nothing else. Free-form fields (`params`, `scene`, a submitted payload)
are plain JSON values here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Literal

from service.core.agents.schema import Mode
from service.core.ids import ANONYMOUS, Principal
from service.core.values import LiveRun

#: What a query on a chat that has an active run does: fail, wait its turn, or stop the run.
Strategy = Literal["reject", "enqueue", "interrupt"]

#: How a submitted answer was taken.
SubmitOutcome = Literal["ACCEPTED", "UNKNOWN_RUN", "UNKNOWN_TOOL", "ALREADY_ANSWERED", "EXPIRED"]


class DebugLevel(IntEnum):
    """Which debug events a run emits; each level includes the ones below it."""

    OFF = 0
    BASIC = 1  # usage.update, tool.timing
    STANDARD = 2  # model.start / model.end with truncated input and output
    FULL = 3  # the same, untruncated


@dataclass(frozen=True, slots=True)
class Reference:
    """A file (an upload id) or a URL a query refers to."""

    id: str = ""
    type: str = ""
    name: str = ""
    url: str = ""
    mime_type: str = ""
    size_bytes: int = 0
    sha256: str = ""


@dataclass(frozen=True, slots=True)
class QueryCommand:
    """Start a run of `agent_key` on a chat (a new one when `chat_id` is empty)."""

    agent_key: str
    message: str
    chat_id: str = ""
    request_id: str = ""
    role: str = "user"
    references: tuple[Reference, ...] = ()
    params: dict[str, Any] | None = None
    scene: dict[str, Any] | None = None
    stream: bool = True
    debug_level: DebugLevel | None = None  # None: the service's default
    strategy: Strategy | None = None  # None: the service's default
    principal: Principal = ANONYMOUS  # who asks; owns the chat and the run
    mode: Mode | None = None  # one of the agent's `modes`; None: its `mode`
    # Settings replaced for this run, by the agent file's names ("temperature",
    # "budget.maxModelCalls", …): each must be among the agent's `overrides`.
    overrides: dict[str, Any] | None = None
    # When the run started (ms since the epoch): its prompts' {{date}} and {{now}}. Set by
    # the front door; kept with the command, so a resumed run renders the same prompts.
    started_at_ms: int = 0
    # Tools the client declares for this run ({name, description, parameters} each), where
    # the agent allows it (`clientTools`): frontend tools the client answers.
    tools: tuple[dict[str, Any], ...] = ()
    # The run's id, when the front door chose it before the run started (to register its
    # webhooks first); "": drawn when the run is prepared.
    run_id: str = ""
    # Started in the background (Start): nobody following it is no reason to cancel it.
    background: bool = False

    def to_record(self) -> dict[str, Any]:
        """The command as JSON data (what a run's journal keeps of its query)."""
        data = {name: getattr(self, name) for name in _QUERY_FIELDS}
        data["references"] = [
            {name: getattr(r, name) for name in _REFERENCE_FIELDS} for r in self.references
        ]
        data["tools"] = list(self.tools)
        data["principal"] = self.principal.to_record()
        data["debug_level"] = None if self.debug_level is None else int(self.debug_level)
        return data

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> QueryCommand:
        fields = dict(data)
        fields["references"] = tuple(Reference(**r) for r in fields.get("references", ()))
        fields["tools"] = tuple(fields.get("tools", ()))
        fields["principal"] = Principal.from_record(fields.get("principal"))
        level = fields.get("debug_level")
        fields["debug_level"] = None if level is None else DebugLevel(level)
        return cls(**fields)


_QUERY_FIELDS = tuple(QueryCommand.__dataclass_fields__)
_REFERENCE_FIELDS = tuple(Reference.__dataclass_fields__)


@dataclass(frozen=True, slots=True)
class SubmitCommand:
    """A user's answer to a tool (or question, or approval) a run waits on."""

    run_id: str
    tool_id: str
    payload: Any = None
    chat_id: str = ""  # when given, the run must belong to this chat
    request_id: str = ""
    view_id: str = ""
    principal: Principal = ANONYMOUS  # only the run's owner may answer


@dataclass(frozen=True, slots=True)
class SubmitResult:
    """What happened to a submitted payload."""

    outcome: SubmitOutcome
    detail: str

    @property
    def accepted(self) -> bool:
        return self.outcome == "ACCEPTED"


@dataclass(frozen=True, slots=True)
class UploadCommand:
    """Store a file that later queries can reference."""

    name: str
    content: bytes
    mime_type: str = ""
    chat_id: str = ""
    request_id: str = ""
    principal: Principal = ANONYMOUS  # owns the upload


@dataclass(slots=True)
class ChatView:
    """A chat as GetChat shows it: its replayed events, and its records on request."""

    chat_id: str
    chat_name: str
    events: list[Any] = field(default_factory=list)  # agw.v1.Event, in snapshot form
    records: list[dict[str, Any]] = field(default_factory=list)  # with include_records only
    references: list[dict[str, Any]] = field(default_factory=list)  # as stored (camelCase)
    live_run: LiveRun | None = None  # the chat's run in progress, if any
