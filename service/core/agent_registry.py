"""The agents directory, loaded at start and kept current while the service runs.

Every `*.json` file of the directory (except `agent.schema.json`, dotfiles and editor
temp files) is one agent whose key is the file name. A broken file is recorded in
`errors` and logged once at WARNING; it never disturbs the other agents, and a broken
edit of a file that was valid keeps its last valid version serving.

State is swapped whole (copy-on-write), so a reader never sees a half-applied reload.
`version` increments on each effective change: an agent added, replaced or removed,
or a file's error recorded, changed or cleared. Call the registry from the event loop's
thread (or before the loop runs).
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from service.core.agents import (
    SCHEMA_FILE_NAME,
    AgentDefinition,
    AgentDefinitionError,
    load_agent_file,
)
from service.core.errors import AgentNotFound
from service.core.watch import DirectoryChange, watch_files

log = logging.getLogger(__name__)


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


class AgentRegistry:
    """The valid agents of a directory, by key, with the errors of the broken files."""

    def __init__(
        self, directory: Path, *, on_change: Callable[[RegistryChange], None] | None = None
    ) -> None:
        self.directory = Path(directory)
        self.on_change = on_change
        self._agents: dict[str, AgentDefinition] = {}
        self._errors: dict[str, str] = {}
        self._version = 0
        self._changed = asyncio.Event()

    @property
    def version(self) -> int:
        return self._version

    @property
    def errors(self) -> dict[str, str]:
        """File name → why the file is not (or no longer) loaded as written."""
        return dict(self._errors)

    def load_all(self) -> RegistryChange | None:
        """Scan the whole directory; returns the change, or None when nothing changed."""
        if self.directory.is_dir():
            present = {p.name for p in self.directory.iterdir() if is_agent_file(p) and p.is_file()}
        else:
            log.warning("agents directory %s does not exist", self.directory)
            present = set()
        known = {f"{key}.json" for key in self._agents} | set(self._errors)
        return self._refresh(present | known)

    def get(self, key: str) -> AgentDefinition:
        """The agent `key`; AgentNotFound (listing the available keys) when there is none."""
        agent = self._agents.get(key)
        if agent is not None:
            return agent
        available = ", ".join(sorted(self._agents)) or "none"
        error = self._errors.get(f"{key}.json")
        if error is not None:
            message = f"agent {key!r} is not loaded, its file is invalid ({error})"
        else:
            message = f"unknown agent {key!r}"
        raise AgentNotFound(f"{message}; available agents: {available}", agent_key=key)

    async def wait_for_version(self, version: int, timeout: float | None = None) -> int:  # noqa: ASYNC109
        """Wait until `self.version >= version`; TimeoutError after `timeout` seconds."""
        async with asyncio.timeout(timeout):
            while self._version < version:
                await self._changed.wait()
        return self._version

    async def watch(
        self,
        stop_event: asyncio.Event,
        *,
        force_polling: bool | None = None,
        debounce_ms: int = 1600,
        step_ms: int = 50,
        poll_delay_ms: int = 300,
    ) -> None:
        """Reload changed agent files until `stop_event` is set (see `watch_files`)."""

        if not self.directory.is_dir():
            log.error("agents directory %s does not exist: not watching it", self.directory)
            return
        await watch_files(
            self.directory,
            stop_event,
            relevant=is_agent_file,
            load_all=self.load_all,
            refresh=self._refresh,
            force_polling=force_polling,
            debounce_ms=debounce_ms,
            step_ms=step_ms,
            poll_delay_ms=poll_delay_ms,
        )

    def _refresh(self, names: Iterable[str]) -> RegistryChange | None:
        """Reload the named files and swap the new state in at once."""
        agents, errors = dict(self._agents), dict(self._errors)
        added: list[str] = []
        updated: list[str] = []
        removed: list[str] = []
        failed: list[str] = []
        cleared: list[str] = []
        for name in sorted(names):
            path = self.directory / name
            key = path.stem
            try:
                definition = load_agent_file(path)
            except FileNotFoundError:
                if agents.pop(key, None) is not None:
                    removed.append(key)
                if errors.pop(name, None) is not None:
                    cleared.append(name)
                continue
            except (AgentDefinitionError, OSError) as exc:
                message = str(exc) if isinstance(exc, AgentDefinitionError) else f"{name}: {exc}"
                if errors.get(name) != message:
                    errors[name] = message
                    failed.append(name)
                    kept = "keeping its last valid version" if key in agents else "not loaded"
                    log.warning("invalid agent file %s (%s): %s", path, kept, message)
                continue
            if errors.pop(name, None) is not None:
                cleared.append(name)
            previous = agents.get(key)
            if previous != definition:
                agents[key] = definition
                (updated if previous is not None else added).append(key)
        if not (added or updated or removed or failed or cleared):
            return None
        self._agents, self._errors = agents, errors
        self._version += 1
        change = RegistryChange(
            self._version, *map(tuple, (added, updated, removed, failed, cleared))
        )
        self._changed.set()
        self._changed = asyncio.Event()
        if added or updated or removed:
            log.info("agents reloaded (version %d): %s", self._version, change)
        if self.on_change is not None:
            try:
                self.on_change(change)
            except Exception:
                log.exception("agent registry on_change callback failed")
        return change

    def list(self) -> builtins.list[AgentDefinition]:
        """The valid agents, sorted by key."""
        return [self._agents[key] for key in sorted(self._agents)]
