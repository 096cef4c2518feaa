"""The chat store's interface: append a chat's records, read them back, list chats.

A chat is an append-only sequence of JSON records (SPEC §6): one `query`
record per run, then one `step` record per model turn of that run. The JSONL
file store (`service/core/jsonl_store.py`) implements it; another backend (a
database, an object store) only has to implement `ChatStore`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

Record = dict[str, Any]

CHAT_NAME_LENGTH = 30


def chat_name_of(message: str) -> str:
    """A chat's name: the start of its first query, on one line."""
    name = " ".join(message.split())
    return name if len(name) <= CHAT_NAME_LENGTH else name[: CHAT_NAME_LENGTH - 1] + "…"


@dataclass(slots=True)
class ChatSummary:
    """What ListChats shows of a chat."""

    chat_id: str
    chat_name: str
    agent_key: str
    created_at: int
    updated_at: int
    run_count: int


class ChatStore(Protocol):
    """Durable, append-only chat records."""

    async def append(self, chat_id: str, records: list[Record]) -> None:
        """Append `records` to the chat (creating it), atomically per record."""
        ...

    async def read(self, chat_id: str) -> list[Record]:
        """Every readable record of the chat, in order; raises ChatNotFound."""
        ...

    def summary(self, chat_id: str) -> ChatSummary | None:
        """The chat's summary, or None when the chat does not exist."""
        ...

    def page(self, limit: int, cursor: str = "") -> tuple[list[ChatSummary], str]:
        """Chats newest first, `limit` at a time; returns the page and the next cursor."""
        ...

    async def sync(self, chat_id: str) -> None:
        """Make the chat's appended records durable (fsync), per the store's policy."""
        ...
