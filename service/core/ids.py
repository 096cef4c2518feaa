"""The ids the core accepts from outside, and the names it derives.

Ids that reach storage (chat files, run logs) are checked here, once, before
anything is registered: a bad id is an `InvalidRequest`, never a path. The
patterns are anchored with `\\Z` so that no trailing newline slips through.
"""

from __future__ import annotations

import re

from service.core.errors import InvalidRequest

_CHAT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")
_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")

CHAT_NAME_LENGTH = 30


def valid_chat_id(chat_id: str) -> bool:
    return bool(_CHAT_ID.match(chat_id)) and ".." not in chat_id


def shorten(value: str, limit: int = 64) -> str:
    """`value` cut to `limit` characters, for echoing input in a message."""
    return value if len(value) <= limit else value[:limit] + "…"


def check_chat_id(chat_id: str) -> str:
    """Chat ids become file names: letters, digits, `_`, `-`, `.`; at most 128."""
    if not valid_chat_id(chat_id):
        raise InvalidRequest(
            f"invalid chatId {shorten(chat_id, 140)!r}: use 1-128 letters, digits, '_', '-' or '.'"
        )
    return chat_id


def valid_run_id(run_id: str) -> bool:
    return bool(_RUN_ID.match(run_id))


def chat_name_of(message: str) -> str:
    """A chat's name: the start of its first query, on one line."""
    name = " ".join(message.split())
    return name if len(name) <= CHAT_NAME_LENGTH else name[: CHAT_NAME_LENGTH - 1] + "…"
