"""Chat summaries kept beside the records, as ListChats shows them, and their paging.

A chat's name is taken from its first query, and from each `update` record (a rename)
after it.
"""

from __future__ import annotations

from collections.abc import Iterable

from service.core.ids import ANONYMOUS, Principal, chat_name_of
from service.core.values import ChatSummary, Record


def summarize(summaries: dict[str, ChatSummary], chat_id: str, record: Record) -> None:
    """Account for `record` in the summary of its chat (creating it on the chat's first)."""
    updated = int(record.get("updatedAt") or 0)
    summary = summaries.get(chat_id)
    if summary is None:
        query = record.get("query") or {}
        summary = ChatSummary(
            chat_id=chat_id,
            chat_name=chat_name_of(str(query.get("message") or "")),
            agent_key=str(query.get("agentKey") or ""),
            created_at=updated,
            updated_at=updated,
            run_count=0,
            owner=Principal.from_record(record.get("owner")),
        )
        summaries[chat_id] = summary
    if record.get("_type") == "query":
        summary.run_count += 1
    elif record.get("_type") == "update" and isinstance(record.get("chatName"), str):
        summary.chat_name = record["chatName"]
    summary.updated_at = max(summary.updated_at, updated)


def page_of(
    summaries: Iterable[ChatSummary],
    limit: int,
    cursor: str = "",
    owner: Principal = ANONYMOUS,
    name_contains: str = "",
) -> tuple[list[ChatSummary], str]:
    """One page of `owner`'s chats, newest first, and the next page's cursor ("" at the end);
    with `name_contains`, only those whose name contains it (ignoring case)."""
    needle = name_contains.casefold()
    mine = (s for s in summaries if s.owner == owner and needle in s.chat_name.casefold())
    ordered = sorted(mine, key=lambda s: (-s.updated_at, s.chat_id))
    start = int(cursor) if cursor.isdigit() and len(cursor) <= 12 else 0
    page = ordered[start : start + limit]
    more = start + limit < len(ordered)
    return page, str(start + limit) if more else ""


def expired_of(summaries: Iterable[ChatSummary], before: int, limit: int) -> list[ChatSummary]:
    """At most `limit` chats, anyone's, last changed before `before` (ms), oldest first."""
    old = sorted((s for s in summaries if s.updated_at < before), key=lambda s: s.updated_at)
    return old[:limit]
