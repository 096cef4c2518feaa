"""The ids the core accepts from outside, the names it derives, and who calls.

Ids that reach storage (chat files, run logs) are checked here, once, before
anything is registered: a bad id is an `InvalidRequest`, never a path. The
patterns are anchored with `\\Z` so that no trailing newline slips through.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

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


@dataclass(frozen=True, slots=True)
class Principal:
    """Who calls: a subject within a tenant. Every chat, run and upload has one owner.

    With authentication off every caller is `ANONYMOUS`, which owns everything
    created without authentication.
    """

    tenant: str = ""
    subject: str = ""
    # How the caller authenticated, not who it is (neither counts in ownership): the name
    # of its API key ("" for a token or no authentication), and its roles ("admin", ...).
    key: str = field(default="", compare=False)
    roles: frozenset[str] = field(default=frozenset(), compare=False)

    @property
    def anonymous(self) -> bool:
        return not (self.tenant or self.subject)

    def to_record(self) -> dict[str, str]:
        return {"tenant": self.tenant, "subject": self.subject}

    def has(self, role: str) -> bool:
        """Whether the caller holds `role` (`EVERY_ROLE` holds them all)."""
        return role in self.roles or EVERY_ROLE in self.roles

    @staticmethod
    def from_record(data: object) -> Principal:
        """The owner stored in a record (`{"tenant", "subject"}`); absent: anonymous."""
        if not isinstance(data, dict):
            return ANONYMOUS
        return Principal(str(data.get("tenant") or ""), str(data.get("subject") or ""))

    def __str__(self) -> str:
        return f"{self.tenant}/{self.subject}" if not self.anonymous else "anonymous"


ANONYMOUS = Principal()

#: The role that stands for every role: the one caller's when authentication is off.
EVERY_ROLE = "*"
#: The role of the calls that change the service for everyone (the agent store's RPCs).
ADMIN = "admin"
