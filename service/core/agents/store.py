"""Where agents are kept with their versions when they are not (only) files: the port.

An `AgentStore` keeps, per agent key, every version ever written — never changed,
never removed: a rollback writes a new version whose definition is an older one's. The
newest version of a key is the one served. Implementations: in process, PostgreSQL
(service/state/). The store tells who listens (`subscribe`) which key changed, on this
replica or (PostgreSQL's LISTEN/NOTIFY) on any other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

#: How a version came to be.
AgentChange = Literal["created", "updated", "rolled_back", "seeded"]


@dataclass(frozen=True, slots=True)
class StoredAgent:
    """One version of an agent as the store keeps it."""

    key: str
    version: int  # 1, 2, … per key
    definition: dict[str, Any]  # the agent file's JSON, as given (validated when written)
    created_at: int  # ms since the epoch
    created_by: str  # the caller, "tenant/subject"
    change: AgentChange
    source_version: int = 0  # a rollback: the version whose definition it restored
    comment: str = ""


class AgentStore(Protocol):
    """The agents' versions, shared by every replica that uses the same store."""

    async def open(self) -> None:
        """Connect (and listen for changes) before the first call."""
        ...

    async def close(self) -> None:
        """Disconnect; no call follows."""
        ...

    def subscribe(self, changed: Callable[[str], None]) -> None:
        """Call `changed(key)` whenever a version of `key` is written, here or elsewhere."""
        ...

    async def put(
        self,
        key: str,
        definition: dict[str, Any],
        *,
        change: AgentChange,
        created_by: str,
        expected: int | None,
        source_version: int = 0,
        comment: str = "",
    ) -> StoredAgent | int:
        """Write the next version of `key`; it, or (nothing written) the current version
        when it is not `expected` (0: the key must have none; None: whatever it is)."""
        ...

    async def current(self) -> dict[str, StoredAgent]:
        """The newest version of every key."""
        ...

    async def history(self, key: str) -> list[StoredAgent]:
        """Every version of `key`, newest first (empty: none)."""
        ...
