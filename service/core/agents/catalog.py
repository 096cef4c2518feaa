"""Agents kept in a store with their versions, served beside the agents directory.

With an `AgentStore` (PostgreSQL, or in process), agents are created, updated and rolled
back through calls: each write is validated exactly like an agent file (`loader.py`: the
same parser and the same report of what is wrong), then becomes a new version of its key.
The newest version of a key is served, on every replica, in place of a file of the same
key (files stay the embedded default, and can seed the store). A change reaches every
replica at once through the store's notifications (PostgreSQL's LISTEN/NOTIFY), and at
worst at the next full reading every `poll_s`. A run keeps the definition it started with.

Writing needs the role "admin" (`ADMIN`); reading versions too (they name who wrote them).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
from typing import Any

from service.core.agents.definition import AgentDefinition
from service.core.agents.loader import (
    AgentDefinitionError,
    AgentIssue,
    parse_agent_json,
    parse_agent_text,
)
from service.core.agents.registry import AgentRegistry
from service.core.agents.store import AgentChange, AgentStore, StoredAgent
from service.core.errors import (
    AgentNotFound,
    Conflict,
    InvalidRequest,
    NotFound,
    PermissionDenied,
)
from service.core.ids import ADMIN, Principal, shorten

log = logging.getLogger("agw.agents")

NO_STORE = (
    "agents are read from the agents directory only: set AGW_AGENT_STORE=postgres (or memory) "
    "to create, update and roll them back"
)


def validated(key: str, definition: dict[str, Any], where: str) -> AgentDefinition:
    """`definition` as an agent of `key`, checked as the file `{key}.json` would be."""
    text = json.dumps(definition, ensure_ascii=False)
    return parse_agent_text(text, key=key, source=where)


class AgentCatalog:
    """The stored agents: written through it, served through the registry."""

    def __init__(
        self, registry: AgentRegistry, store: AgentStore | None, *, poll_s: float = 5.0
    ) -> None:
        self.registry = registry
        self.store = store
        self.poll_s = poll_s
        self._tasks: set[asyncio.Task[None]] = set()
        self._poll: asyncio.Task[None] | None = None

    # -- serving -----------------------------------------------------------------------

    async def open(self) -> None:
        if self.store is None:
            return
        await self.store.open()
        self.store.subscribe(self._changed)
        await self.sync()
        self._poll = asyncio.create_task(self._polling(), name="agent-store")

    async def close(self) -> None:
        if self._poll is not None:
            self._poll.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poll
        for task in list(self._tasks):
            task.cancel()
        if self.store is not None:
            await self.store.close()

    async def _polling(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.sync()
            except Exception:
                log.warning("could not read the agent store; trying again", exc_info=True)

    def _changed(self, key: str) -> None:
        task = asyncio.get_running_loop().create_task(self._refresh(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refresh(self, key: str) -> None:
        assert self.store is not None
        try:
            history = await self.store.history(key)
        except Exception:
            log.warning("could not read agent %s from the store", key, exc_info=True)
            return
        if history:
            self._serve(history[0])

    async def sync(self) -> None:
        """Serve the newest version of every stored agent."""
        assert self.store is not None
        for stored in (await self.store.current()).values():
            self._serve(stored)

    def _serve(self, stored: StoredAgent) -> None:
        if self.registry.version_of(stored.key) >= stored.version:
            return  # already served (or a newer one is)
        where = f"agent store: {stored.key} v{stored.version}"
        try:
            agent = validated(stored.key, stored.definition, where)
        except AgentDefinitionError as error:  # written by another version of the service
            log.error("%s is not valid here; not served: %s", where, error)
            return
        self.registry.set_stored(agent, stored.version)
        log.info("agent %s: serving version %d (%s)", stored.key, stored.version, stored.change)

    async def seed(self, created_by: str = "seed") -> list[str]:
        """Write each agent of the directory that the store lacks as its version 1."""
        store = self._store()
        seeded = []
        for agent in self.registry.files():
            written = await store.put(
                agent.key,
                agent.to_json_dict(),
                change="seeded",
                created_by=created_by,
                expected=0,
                comment="from the agents directory",
            )
            if isinstance(written, StoredAgent):
                self._serve(written)
                seeded.append(agent.key)
        if seeded:
            log.info("seeded the agent store with %s", ", ".join(seeded))
        return seeded

    # -- writing -----------------------------------------------------------------------

    def _store(self) -> AgentStore:
        if self.store is None:
            raise Conflict(NO_STORE)
        return self.store

    @staticmethod
    def _admin(principal: Principal) -> None:
        if not principal.has(ADMIN):
            raise PermissionDenied(
                f"managing agents needs the role {ADMIN!r}; these credentials do not have it",
                role=ADMIN,
            )

    @staticmethod
    def definition_of(definition: dict[str, Any] | None, text: str) -> dict[str, Any]:
        """The definition given as JSON data, or as an agent file's text (`\"\"\"` prompts
        allowed), exactly one of them."""
        if (definition is None) == (not text):
            raise InvalidRequest("give the agent as definition (JSON) or definitionText, once")
        if definition is not None:
            return definition
        try:
            data = parse_agent_json(text)
        except AgentDefinitionError as error:
            raise AgentDefinitionError(error.issues, "definitionText") from None
        if not isinstance(data, dict):
            issue = AgentIssue("", "the file must hold one JSON object")
            raise AgentDefinitionError([issue], "definitionText")
        return data

    async def _write(
        self,
        principal: Principal,
        key: str,
        definition: dict[str, Any],
        change: AgentChange,
        expected: int | None,
        *,
        source_version: int = 0,
        comment: str = "",
    ) -> StoredAgent:
        self._admin(principal)
        store = self._store()
        validated(key, definition, f"agent {shorten(key)!r}")
        written = await store.put(
            key,
            definition,
            change=change,
            created_by=str(principal),
            expected=expected,
            source_version=source_version,
            comment=comment,
        )
        if not isinstance(written, StoredAgent):
            if expected == 0:
                raise Conflict(
                    f"agent {key!r} is already in the store (version {written}): update it",
                    agent_key=key,
                    version=str(written),
                )
            raise Conflict(
                f"agent {key!r} is at version {written}, not {expected}: read it again",
                agent_key=key,
                version=str(written),
            )
        self._serve(written)
        return written

    async def create(
        self, principal: Principal, key: str, definition: dict[str, Any], comment: str = ""
    ) -> StoredAgent:
        """Version 1 of a new stored agent (a file of that key is then overridden)."""
        return await self._write(principal, key, definition, "created", 0, comment=comment)

    async def update(
        self,
        principal: Principal,
        key: str,
        definition: dict[str, Any],
        expected_version: int = 0,
        comment: str = "",
    ) -> StoredAgent:
        """The next version of a stored agent; `expected_version` (0: any) must be current."""
        await self._history(principal, key)
        expected = expected_version or None
        return await self._write(principal, key, definition, "updated", expected, comment=comment)

    async def rollback(
        self,
        principal: Principal,
        key: str,
        version: int,
        expected_version: int = 0,
        comment: str = "",
    ) -> StoredAgent:
        """A new version of `key` with the definition of its `version`."""
        history = await self._history(principal, key)
        earlier = next((v for v in history if v.version == version), None)
        if earlier is None:
            raise NotFound(
                f"agent {key!r} has no version {version} (it has 1 to {history[0].version})",
                agent_key=key,
            )
        return await self._write(
            principal,
            key,
            earlier.definition,
            "rolled_back",
            expected_version or None,
            source_version=version,
            comment=comment,
        )

    async def versions(self, principal: Principal, key: str) -> builtins.list[StoredAgent]:
        """Every version of a stored agent, newest first."""
        return await self._history(principal, key)

    async def _history(self, principal: Principal, key: str) -> builtins.list[StoredAgent]:
        self._admin(principal)
        if not key:
            raise InvalidRequest("agentKey is required")
        history = await self._store().history(key)
        if not history:
            shown = shorten(key)
            raise AgentNotFound(f"agent {shown!r} is not in the agent store", agent_key=shown)
        return history
