"""The tools: built-in backend tools, the tool files of a directory, and each stage's tool set.

Built-in backend tools (`BackendTool`: a default definition and its implementation)
are registered in code. Tool files (`*.backend`, `*.action`, `*.html`, `*.qlc`,
`*.dqlc`) are loaded from the directory and kept current while the service runs,
like the agents: a broken file is recorded in `errors` and logged, and never takes
the valid tools down (a broken edit of a valid file keeps its last valid version).
A `.backend` entry may redefine a built-in (its description, parameters,
`after_call_hint`); it cannot define a backend tool the service has no
implementation of. A name defined twice keeps its first definition (built-ins
first, then files in name order) and the later one is reported.

`for_stage` gives a stage exactly its configured tools — refusing unknown names
and names of the wrong kind — plus the stage's fixed planning tools.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from service.core.agents import ResolvedStage, ToolPolicy
from service.core.tools.definitions import (
    ToolDefinition,
    ToolDefinitionError,
    ToolNotFound,
    kind_of,
    load_tool_file,
)
from service.core.tools.planning import PLANNING_DEFINITIONS
from service.core.watch import DirectoryChange, watch_files

log = logging.getLogger(__name__)

HINTS_HEADING = "## After calling a tool"


@dataclass(frozen=True, slots=True)
class ToolCallInfo:
    """What a tool implementation knows about the call it serves."""

    run_id: str
    chat_id: str
    tool_id: str
    tool_name: str
    task_id: str = ""
    # Ask the user a question and wait for the answer (question.ask / Submit).
    ask: Callable[[str, Sequence[str]], Awaitable[Any]] | None = None


class ToolHandler(Protocol):
    """A backend tool's implementation: the parsed arguments in, a JSON-compatible result out."""

    def __call__(self, arguments: dict[str, Any], call: ToolCallInfo) -> Awaitable[Any]: ...


@dataclass(frozen=True, slots=True)
class BackendTool:
    """A built-in backend tool: its default definition and its implementation."""

    definition: ToolDefinition
    handler: ToolHandler


@dataclass(frozen=True, slots=True)
class StageTools:
    """The tools one stage offers: its ordinary tools and its planning tools."""

    ordinary: tuple[ToolDefinition, ...] = ()
    planning: tuple[ToolDefinition, ...] = ()
    by_name: Mapping[str, ToolDefinition] = field(default_factory=dict)

    @staticmethod
    def of(
        ordinary: Iterable[ToolDefinition] = (), planning: Iterable[ToolDefinition] = ()
    ) -> StageTools:
        ordinary, planning = tuple(ordinary), tuple(planning)
        return StageTools(ordinary, planning, {d.name: d for d in (*ordinary, *planning)})

    def schemas(self, *, ordinary: bool = True, planning: bool = True) -> list[dict[str, Any]]:
        """The OpenAI `tools[]` of the offered tools."""
        chosen = (self.ordinary if ordinary else ()) + (self.planning if planning else ())
        return [d.schema() for d in chosen]

    def system_prompt(self, base: str) -> str:
        """`base` with the `after_call_hint`s of the stage's tools appended."""
        hints = [f"- {d.name}: {d.after_call_hint}" for d in self.ordinary if d.after_call_hint]
        if not hints:
            return base
        return f"{base.rstrip()}\n\n{HINTS_HEADING}\n" + "\n".join(hints)


#: One effective change: tools added/updated/removed, files failed/fixed.
ToolsChange = DirectoryChange


def is_tool_file(path: Path) -> bool:
    """Whether a file name is a tool file (a known suffix, not a dotfile or editor temp)."""
    name = path.name
    return (
        kind_of(path) is not None
        and not name.startswith((".", "#", "~"))
        and len(name) > len(path.suffix)
    )


class ToolRegistry:
    """Built-in tools and the tools of a directory, by name."""

    def __init__(
        self,
        directory: Path | None = None,
        *,
        builtin: Iterable[BackendTool] = (),
        default_timeout_s: float = 30.0,
        on_change: Callable[[ToolsChange], None] | None = None,
    ) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.default_timeout_s = default_timeout_s
        self.on_change = on_change
        self._builtins: dict[str, BackendTool] = {t.definition.name: t for t in builtin}
        self._files: dict[str, tuple[ToolDefinition, ...]] = {}  # last valid parse per file
        self._file_errors: dict[str, str] = {}
        self._tools: dict[str, ToolDefinition] = {}
        self._errors: dict[str, str] = {}
        self._version = 0
        self._changed = asyncio.Event()
        self._rebuild()

    # -- reading -----------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    @property
    def errors(self) -> dict[str, str]:
        """File name → why (some of) its tools are not loaded as written."""
        return dict(self._errors)

    def list(self) -> builtins.list[ToolDefinition]:
        """Every available tool, sorted by name."""
        return [self._tools[name] for name in sorted(self._tools)]

    def get(self, name: str) -> ToolDefinition | None:
        return self._tools.get(name)

    def handler(self, name: str) -> ToolHandler | None:
        """The implementation of backend tool `name`, if it has one."""
        tool = self._builtins.get(name)
        return tool.handler if tool is not None else None

    def for_stage(self, stage: ResolvedStage, policy: ToolPolicy = "ALLOW") -> StageTools:
        """The tools `stage` offers under `policy` (DISALLOW: only its planning tools)."""
        planning = [PLANNING_DEFINITIONS[name] for name in stage.planning_tools]
        if policy == "DISALLOW":
            return StageTools.of((), planning)
        ordinary: builtins.list[ToolDefinition] = []
        problems: builtins.list[str] = []
        wanted = (
            ("backend", "backends", stage.tools.backends),
            ("frontend", "frontends", stage.tools.frontends),
            ("action", "actions", stage.tools.actions),
        )
        for kind, key, names in wanted:
            for name in names:
                definition = self._tools.get(name)
                if definition is None:
                    problems.append(f"{key}: '{name}' is not defined")
                elif definition.kind != kind:
                    problems.append(f"{key}: '{name}' is a {definition.kind} tool")
                else:
                    ordinary.append(definition)
        if problems:
            available = ", ".join(sorted(self._tools)) or "none"
            text = "; ".join(problems)
            raise ToolNotFound(
                f"stage {stage.name!r}: {text} (available tools: {available})", stage=stage.name
            )
        return StageTools.of(ordinary, planning)

    # -- changing ----------------------------------------------------------------------

    def register(self, tool: BackendTool) -> None:
        """Add or replace a built-in backend tool."""
        self._builtins[tool.definition.name] = tool
        self._rebuild()

    def load_all(self) -> ToolsChange | None:
        """Scan the whole directory; returns the change, or None when nothing changed."""
        present: set[str] = set()
        if self.directory is not None and self.directory.is_dir():
            present = {p.name for p in self.directory.iterdir() if is_tool_file(p) and p.is_file()}
        elif self.directory is not None:
            log.warning("tools directory %s does not exist", self.directory)
        return self._refresh(present | set(self._files) | set(self._file_errors))

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
        """Reload changed tool files until `stop_event` is set (or the task is cancelled)."""
        directory = self.directory
        if directory is None or not directory.is_dir():
            log.error("tools directory %s does not exist: not watching it", directory)
            return

        await watch_files(
            directory,
            stop_event,
            relevant=is_tool_file,
            load_all=self.load_all,
            refresh=self._refresh,
            force_polling=force_polling,
            debounce_ms=debounce_ms,
            step_ms=step_ms,
            poll_delay_ms=poll_delay_ms,
        )

    def _refresh(self, names: Iterable[str]) -> ToolsChange | None:
        directory = self.directory
        if directory is None:
            return None
        for name in sorted(names):
            path = directory / name
            try:
                tools = load_tool_file(path)
            except FileNotFoundError:
                self._files.pop(name, None)
                self._file_errors.pop(name, None)
                continue
            except (ToolDefinitionError, OSError) as exc:
                message = str(exc) if isinstance(exc, ToolDefinitionError) else f"{name}: {exc}"
                if self._file_errors.get(name) != message:
                    kept = "keeping its last valid version" if name in self._files else "not loaded"
                    log.warning("invalid tool file %s (%s): %s", path, kept, message)
                self._file_errors[name] = message
                continue
            self._file_errors.pop(name, None)
            self._files[name] = tools
        return self._rebuild()

    def _rebuild(self) -> ToolsChange | None:
        """Recompute the tools from built-ins and files; swap the result in at once."""
        tools = {name: t.definition for name, t in self._builtins.items()}
        errors = dict(self._file_errors)
        for file_name in sorted(self._files):
            problems = []
            for definition in self._files[file_name]:
                problem = self._conflict(tools, definition)
                if problem:
                    problems.append(f"'{definition.name}': {problem}")
                    continue
                builtin = self._builtins.get(definition.name)
                if builtin is not None and definition.timeout_s is None:
                    definition = replace(definition, timeout_s=builtin.definition.timeout_s)
                tools[definition.name] = definition
            if problems:
                text = f"{file_name}: " + "; ".join(problems)
                errors[file_name] = f"{errors[file_name]}; {text}" if file_name in errors else text
        old_tools, old_errors = self._tools, self._errors
        added = tuple(sorted(tools.keys() - old_tools.keys()))
        removed = tuple(sorted(old_tools.keys() - tools.keys()))
        updated = tuple(
            sorted(n for n in tools.keys() & old_tools.keys() if tools[n] != old_tools[n])
        )
        failed = tuple(sorted(f for f in errors if errors[f] != old_errors.get(f)))
        cleared = tuple(sorted(old_errors.keys() - errors.keys()))
        for file_name in failed:
            if file_name not in self._file_errors:  # parse errors were logged when read
                log.warning("tool file %s: %s", file_name, errors[file_name])
        if not (added or updated or removed or failed or cleared):
            return None
        self._tools, self._errors = tools, errors
        self._version += 1
        change = ToolsChange(self._version, added, updated, removed, failed, cleared)
        self._changed.set()
        self._changed = asyncio.Event()
        if added or updated or removed:
            log.info("tools reloaded (version %d): %s", self._version, change)
        if self.on_change is not None:
            try:
                self.on_change(change)
            except Exception:
                log.exception("tool registry on_change callback failed")
        return change

    def _conflict(self, tools: dict[str, ToolDefinition], definition: ToolDefinition) -> str:
        """Why `definition` cannot join `tools` ("" when it can)."""
        name = definition.name
        if name in PLANNING_DEFINITIONS:
            return "is a planning tool of PLAN_EXECUTE and cannot be redefined"
        existing = tools.get(name)
        builtin = name in self._builtins
        if existing is not None and not (builtin and existing.source == "built-in"):
            return f"already defined in {existing.source}"
        if builtin and definition.kind != "backend":
            return "is a built-in backend tool; only a .backend file may redefine it"
        if definition.kind == "backend" and not builtin:
            return "no such built-in backend tool (a .backend file can only describe built-ins)"
        return ""
