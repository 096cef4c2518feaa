"""The in-process `AgentStore`: agents' versions in a dict, for one process (and tests)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from service.core.agents.store import AgentChange, StoredAgent


class LocalAgentStore:
    """Every version of every stored agent, in memory; changes told to subscribers at once."""

    def __init__(self) -> None:
        self._versions: dict[str, list[StoredAgent]] = {}
        self._listeners: list[Callable[[str], None]] = []

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def subscribe(self, changed: Callable[[str], None]) -> None:
        self._listeners.append(changed)

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
        versions = self._versions.setdefault(key, [])
        current = versions[-1].version if versions else 0
        if expected is not None and expected != current:
            return current
        stored = StoredAgent(
            key,
            current + 1,
            definition,
            time.time_ns() // 1_000_000,
            created_by,
            change,
            source_version,
            comment,
        )
        versions.append(stored)
        for listener in self._listeners:
            listener(key)
        return stored

    async def current(self) -> dict[str, StoredAgent]:
        return {key: versions[-1] for key, versions in self._versions.items() if versions}

    async def history(self, key: str) -> list[StoredAgent]:
        return list(reversed(self._versions.get(key, [])))
