"""The agents directory, loaded at start and kept current while the service runs.

Every `*.json` file of the directory (except `agent.schema.json`, dotfiles and editor
temp files) is one agent whose key is the file name. The directory is a
`DirectoryRegistry` (service/core/agents/directory.py): a broken file is recorded in
`errors` and logged once at WARNING; it never disturbs the other agents, and a broken
edit of a file that was valid keeps its last valid version serving. `version`
increments on each effective change: an agent added, replaced or removed, or a
file's error recorded, changed or cleared.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from service.core.agents.definition import AgentDefinition
from service.core.agents.directory import (
    Combined,
    DirectoryChange,
    DirectoryRegistry,
    InvalidFile,
    first_wins,
)
from service.core.agents.loader import SCHEMA_FILE_NAME, AgentDefinitionError, load_agent_file
from service.core.errors import AgentNotFound
from service.core.ids import shorten

log = logging.getLogger("agw.agents")


#: What one effective change did: agent keys added/updated/removed, files failed/fixed.
RegistryChange = DirectoryChange


def is_agent_file(path: Path) -> bool:
    """Whether a file name is an agent file (not the schema, a dotfile or an editor temp)."""
    name = path.name
    return (
        name.endswith(".json")
        and name != SCHEMA_FILE_NAME
        and not name.startswith((".", "#", "~"))
        and len(name) > len(".json")
    )


class AgentFiles:
    """Agent files: one agent per `*.json` file, keyed by the file name."""

    noun = "agent"

    def relevant(self, path: Path) -> bool:
        return is_agent_file(path)

    def load(self, path: Path) -> Sequence[AgentDefinition]:
        try:
            return (load_agent_file(path),)
        except AgentDefinitionError as exc:
            raise InvalidFile(str(exc)) from exc

    def combine(self, files: Mapping[str, Sequence[AgentDefinition]]) -> Combined[AgentDefinition]:
        return first_wins(files, lambda agent: agent.key)


class AgentRegistry(DirectoryRegistry[AgentDefinition]):
    """The valid agents of a directory, by key, with the errors of the broken files."""

    def __init__(
        self, directory: Path, *, on_change: Callable[[RegistryChange], None] | None = None
    ) -> None:
        super().__init__(directory, AgentFiles(), on_change=on_change, logger=log)
        self._stored: dict[str, tuple[AgentDefinition, int]] = {}  # key -> (agent, version)

    # -- the agent store's versions (catalog.py), served in place of files ---------------

    @property
    def items(self) -> Mapping[str, AgentDefinition]:
        """The valid agents by key: the directory's, each replaced by the store's version of
        its key when there is one, and the store's other agents."""
        if not self._stored:
            return self._items
        return {**self._items, **{key: agent for key, (agent, _) in self._stored.items()}}

    def list(self) -> builtins.list[AgentDefinition]:
        items = self.items
        return [items[key] for key in sorted(items)]

    def files(self) -> builtins.list[AgentDefinition]:
        """The agents of the directory alone, sorted by key."""
        return [self._items[key] for key in sorted(self._items)]

    def set_stored(self, agent: AgentDefinition, version: int) -> None:
        """Serve `agent` as the agent store's `version` of its key."""
        self._stored = {**self._stored, agent.key: (agent, version)}

    def version_of(self, key: str) -> int:
        """The store's version served for `key`; 0 when it comes from a file (or nowhere)."""
        stored = self._stored.get(key)
        return stored[1] if stored is not None else 0

    def get(self, key: str) -> AgentDefinition:
        """The agent `key`; AgentNotFound (listing the available keys) when there is none."""
        agents = self.items
        agent = agents.get(key)
        if agent is not None:
            return agent
        available = ", ".join(sorted(agents)) or "none"
        error = self._errors.get(f"{key}.json")
        shown = shorten(key)
        if error is not None:
            message = f"agent {shown!r} is not loaded, its file is invalid ({error})"
        else:
            message = f"unknown agent {shown!r}"
        raise AgentNotFound(f"{message}; available agents: {available}", agent_key=shown)
