"""The value types the core's faces, its ports and its wings share.

A chat's records and its summary, a run as any replica sees it (`RunRef`,
`LiveRun` with its open waits), an upload's description: plain, frozen values
that import nothing of the run or the stores, so that the ports and the core's
wings can both use them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from service.core.ids import ANONYMOUS, Principal

Record = dict[str, Any]

#: What waits: a frontend tool, a question, a permission or a plan approval.
WaitKind = Literal["frontend_tool", "question", "permission", "plan_approval"]
WAIT_KINDS: tuple[WaitKind, ...] = ("frontend_tool", "question", "permission", "plan_approval")


@dataclass(frozen=True, slots=True)
class OpenWait:
    """A wait of a run open right now: the id Submit answers, what waits, the tool's name."""

    tool_id: str
    kind: WaitKind
    tool_name: str


@dataclass(slots=True)
class ChatSummary:
    """What ListChats shows of a chat."""

    chat_id: str
    chat_name: str
    agent_key: str
    created_at: int
    updated_at: int
    run_count: int
    owner: Principal = ANONYMOUS  # from the chat's first query record


@dataclass(frozen=True, slots=True)
class RunRef:
    """A live (or recently ended) run as any replica sees it."""

    run_id: str
    chat_id: str
    owner: Principal = ANONYMOUS
    running: bool = True  # False once its terminal event is out


@dataclass(frozen=True, slots=True)
class LiveRun:
    """A chat's run in progress as any replica sees it: where its stream is, what it waits for."""

    run_id: str
    chat_id: str
    owner: Principal
    agent_key: str
    last_seq: int  # the seq of its last event so far
    waits: list[OpenWait]  # open right now, in the order they opened


@dataclass(frozen=True, slots=True)
class StoredUpload:
    """An upload as stored: its id, name, kind, MIME type, size, SHA-256, chat and owner."""

    id: str
    name: str
    type: str  # "image" or "file"
    mime_type: str
    size_bytes: int
    sha256: str
    chat_id: str
    owner: dict[str, str] | None = None  # {"tenant", "subject"}; None: anonymous


@dataclass(frozen=True, slots=True)
class SpendEntry:
    """What the model calls of one (UTC day, tenant, API key, agent, model) used: a row of
    the spend ledger, or an amount added to one."""

    day: str  # "YYYY-MM-DD", UTC
    tenant: str
    key: str  # the API key's name; "" for a token or no authentication
    agent_key: str
    model: str
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0  # in the price table's currency (0 when the model has no price)

    @property
    def where(self) -> tuple[str, str, str, str, str]:
        return (self.day, self.tenant, self.key, self.agent_key, self.model)
