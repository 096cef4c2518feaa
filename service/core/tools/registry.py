"""The tools: the tool sources merged into one set by name, and each stage's tool set.

The registry merges its `ToolSource`s (service/core/tools/sources.py) in order:
the built-in backend tools (`BackendTool`: a default definition and its
implementation, registered in code), any added sources, then the tool files of
the directory (`*.backend`, `*.action`, `*.html`, `*.qlc`, `*.dqlc`), loaded and
kept current while the service runs, like the agents: a broken file is recorded
in `errors` and logged, and never takes the valid tools down (a broken edit of a
valid file keeps its last valid version). A `.backend` entry may redefine a
built-in (its description, parameters, `after_call_hint`); it cannot define a
backend tool the service has no implementation of. A name defined twice keeps
its first definition (built-ins first, then files in name order) and the later
one is reported.

Resolution follows the sources: every read looks at their versions first, so a
stage's tools (`for_stage`) and a backend tool's implementation (`handler`) are
those of the sources at the model's turn and at the call. `for_stage` gives a
stage exactly its configured tools — refusing unknown names and names of the
wrong kind — plus the stage's fixed planning tools. A stage's `toolConfig.mcp`
names configured MCP servers: every tool such a server offers at the turn is
offered (none while it is down); a name no source stands for is refused.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from service.core.agents.definition import ResolvedStage, ResolvedTools
from service.core.agents.directory import DirectoryChange
from service.core.agents.schema import ToolPolicy
from service.core.tools.definitions import ToolDefinition, ToolKind, ToolNotFound, ToolOrigin
from service.core.tools.planning import PLANNING_DEFINITIONS
from service.core.tools.sources import (
    BackendTool,
    BuiltinTools,
    OriginSource,
    ToolCallInfo,
    ToolFiles,
    ToolHandler,
    ToolSource,
    is_tool_file,
    mcp_origin_id,
)

__all__ = [
    "HINTS_HEADING",
    "BackendTool",
    "StageTools",
    "ToolCallInfo",
    "ToolHandler",
    "ToolRegistry",
    "ToolsChange",
    "is_tool_file",
]

log = logging.getLogger("agw.tools")

HINTS_HEADING = "## After calling a tool"
#: The stages whose tools `ToolRegistry.for_stage` keeps at most (then it starts over).
STAGE_TOOLS_KEPT = 256

#: The configured tools of a stage: (kind, toolConfig key, names) for each kind, and
#: ("mcp", "mcp", server names) for the MCP servers whose every tool is offered.
Wanted = tuple[tuple[ToolKind | Literal["mcp"], str, tuple[str, ...]], ...]


class StageTools:
    """The tools one stage offers: its ordinary tools and its planning tools.

    The stage tools of a registry (`ToolRegistry.for_stage`) follow it: `ordinary`,
    `by_name` and `schemas` give the current definitions of the stage's configured
    tools, so a tool a source adds, changes or removes while a run goes on is
    offered as it is now from the model's next turn on. A configured tool that no
    source defines any more (or not as that kind) is left out of the turn.
    `extended` adds tools that come from the run rather than the sources (a
    stage's subagents, a mode's own planning tools).
    """

    __slots__ = (
        "_by_name",
        "_configured",
        "_fixed",
        "_ordinary",
        "_registry",
        "_version",
        "_wanted",
        "planning",
    )

    def __init__(
        self,
        ordinary: Iterable[ToolDefinition] = (),
        planning: Iterable[ToolDefinition] = (),
        *,
        registry: ToolRegistry | None = None,
        wanted: Wanted = (),
        fixed: Iterable[ToolDefinition] = (),
    ) -> None:
        self.planning = tuple(planning)
        self._registry = registry
        self._wanted = wanted
        self._fixed = tuple(fixed)
        self._version = registry.version if registry is not None else 0
        self._offer(tuple(ordinary))

    @staticmethod
    def of(
        ordinary: Iterable[ToolDefinition] = (), planning: Iterable[ToolDefinition] = ()
    ) -> StageTools:
        """A fixed set of tools."""
        return StageTools(ordinary, planning)

    def extended(
        self, ordinary: Iterable[ToolDefinition] = (), planning: Iterable[ToolDefinition] = ()
    ) -> StageTools:
        """These tools and more: `ordinary` ones offered whatever the sources hold, after the
        configured ones, and `planning` ones (handled by the mode)."""
        tools = StageTools(
            self._configured,
            (*self.planning, *planning),
            registry=self._registry,
            wanted=self._wanted,
            fixed=(*self._fixed, *ordinary),
        )
        tools._version = self._version  # the configured tools are those of this version
        return tools

    @property
    def ordinary(self) -> tuple[ToolDefinition, ...]:
        self._follow()
        return self._ordinary

    @property
    def by_name(self) -> Mapping[str, ToolDefinition]:
        """The ordinary and planning tools by name."""
        self._follow()
        return self._by_name

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

    def _follow(self) -> None:
        """Resolve the configured tools again if the registry changed since the last look."""
        registry = self._registry
        if registry is None or registry.version == self._version:
            return
        self._version = registry.version
        ordinary, problems = registry.select(self._wanted)
        if problems:
            log.warning("configured tools not offered now: %s", "; ".join(problems))
        self._offer(ordinary)

    def _offer(self, ordinary: tuple[ToolDefinition, ...]) -> None:
        self._configured = ordinary
        self._ordinary = ordinary + self._fixed
        self._by_name = {d.name: d for d in (*self._ordinary, *self.planning)}


@functools.lru_cache(maxsize=1024)
def _wanted(tools: ResolvedTools) -> Wanted:
    """What a stage with `tools` wants of the sources: one tuple per distinct `tools`, shared
    by the runs of the stage (each keeps its stage's tools while it runs)."""
    return (
        ("backend", "backends", tools.backends),
        ("frontend", "frontends", tools.frontends),
        ("action", "actions", tools.actions),
        ("mcp", "mcp", tools.mcp),
    )


@dataclass(frozen=True, slots=True)
class _Resolved:
    """A tool as resolved: its definition and the source that runs it (None: not run here)."""

    definition: ToolDefinition
    runs_in: ToolSource | None = None
    redescribed: bool = False


#: One effective change: tools added/updated/removed, files failed/fixed.
ToolsChange = DirectoryChange


class ToolRegistry:
    """The tools of the sources, by name: built-ins, added sources, the tool files."""

    def __init__(
        self,
        directory: Path | None = None,
        *,
        builtin: Iterable[BackendTool] = (),
        sources: Iterable[ToolSource] = (),
        default_timeout_s: float = 30.0,
        on_change: Callable[[ToolsChange], None] | None = None,
    ) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.default_timeout_s = default_timeout_s
        self.on_change = on_change
        self.builtins = BuiltinTools(builtin)
        self.files = (
            ToolFiles(self.directory, on_change=self._files_changed)
            if self.directory is not None
            else None
        )
        self._added: builtins.list[ToolSource] = list(sources)
        self._tools: dict[str, _Resolved] = {}
        self._errors: dict[str, str] = {}
        self._seen: tuple[tuple[int, int], ...] = ()
        # (id of a stage, policy) -> the stage, the version, its tools (`for_stage`)
        self._stage_tools: dict[tuple[int, str], tuple[ResolvedStage, int, StageTools]] = {}
        self._last: ToolsChange | None = None
        self._version = 0
        self._changed = asyncio.Event()
        self.refresh()

    @property
    def sources(self) -> tuple[ToolSource, ...]:
        """The sources in the order names resolve: built-ins, added sources, tool files."""
        files: tuple[ToolSource, ...] = (self.files,) if self.files is not None else ()
        return (self.builtins, *self._added, *files)

    # -- reading -----------------------------------------------------------------------

    @property
    def version(self) -> int:
        self.refresh()
        return self._version

    @property
    def errors(self) -> dict[str, str]:
        """Origin (a file) → why (some of) its tools are not loaded as written."""
        self.refresh()
        return dict(self._errors)

    def list(self) -> builtins.list[ToolDefinition]:
        """Every available tool, sorted by name."""
        self.refresh()
        return [self._tools[name].definition for name in sorted(self._tools)]

    def get(self, name: str) -> ToolDefinition | None:
        self.refresh()
        tool = self._tools.get(name)
        return tool.definition if tool is not None else None

    def handler(self, name: str) -> ToolHandler | None:
        """The implementation of backend tool `name` now, if it has one."""
        self.refresh()
        tool = self._tools.get(name)
        if tool is None or tool.runs_in is None:
            return None
        return tool.runs_in.handler(name)

    def origins(self) -> dict[str, ToolOrigin]:
        """The outside origins of the sources' tools by id, also those offering no tool now."""
        self.refresh()
        found: dict[str, ToolOrigin] = {}
        for source in self.sources:
            if isinstance(source, OriginSource):
                found.update((origin.source_id, origin) for origin in source.origins)
        for tool in self._tools.values():
            origin = tool.definition.origin
            if origin is not None:
                found.setdefault(origin.source_id, origin)
        return found

    def for_stage(self, stage: ResolvedStage, policy: ToolPolicy = "ALLOW") -> StageTools:
        """The tools `stage` offers under `policy` (DISALLOW: only its planning tools): the
        same ones for the same stage while the sources are unchanged (a run asks for its
        stages' tools as its query is checked, then as it runs)."""
        key = (id(stage), policy)
        version = self.version
        known = self._stage_tools.get(key)
        if known is not None and known[0] is stage and known[1] == version:
            return known[2]
        tools = self._stage_tools_now(stage, policy)
        if len(self._stage_tools) >= STAGE_TOOLS_KEPT:
            self._stage_tools.clear()
        self._stage_tools[key] = (stage, version, tools)
        return tools

    def _stage_tools_now(self, stage: ResolvedStage, policy: ToolPolicy) -> StageTools:
        planning = [PLANNING_DEFINITIONS[name] for name in stage.planning_tools]
        if policy == "DISALLOW":
            return StageTools.of((), planning)
        wanted = _wanted(stage.tools)
        ordinary, problems = self.select(wanted)
        if problems:  # what is wrong, in one sentence: not every tool there is
            raise ToolNotFound(f"stage {stage.name!r}: {'; '.join(problems)}", stage=stage.name)
        return StageTools(ordinary, planning, registry=self, wanted=wanted)

    def select(self, wanted: Wanted) -> tuple[tuple[ToolDefinition, ...], builtins.list[str]]:
        """The current definitions of the wanted tools, and why some cannot be had."""
        self.refresh()
        ordinary: builtins.list[ToolDefinition] = []
        problems: builtins.list[str] = []
        for kind, key, names in wanted:
            if kind == "mcp":
                continue
            for name in names:
                tool = self._tools.get(name)
                if tool is None:
                    problems.append(f"{key}: '{name}' is not defined")
                elif tool.definition.kind != kind:
                    problems.append(f"{key}: '{name}' is a {tool.definition.kind} tool")
                else:
                    ordinary.append(tool.definition)
        servers = tuple(name for kind, _, names in wanted if kind == "mcp" for name in names)
        if servers:
            ordinary += self._server_tools(servers, {d.name for d in ordinary}, problems)
        return tuple(ordinary), problems

    def _server_tools(
        self, servers: tuple[str, ...], chosen: set[str], problems: builtins.list[str]
    ) -> builtins.list[ToolDefinition]:
        """The backend tools the MCP servers `servers` offer now, after the `chosen` ones."""
        known = self.origins()
        ids: set[str] = set()
        for server in servers:
            if mcp_origin_id(server) in known:
                ids.add(mcp_origin_id(server))
            else:
                problems.append(f"mcp: '{server}' is not a configured MCP server")
        found: builtins.list[ToolDefinition] = []
        for tool in self._tools.values():
            definition = tool.definition
            origin = definition.origin
            if origin is None or origin.source_id not in ids or definition.name in chosen:
                continue
            if definition.kind == "backend" and tool.runs_in is not None:
                found.append(definition)
        return found

    # -- changing ----------------------------------------------------------------------

    def register(self, tool: BackendTool) -> None:
        """Add or replace a built-in backend tool."""
        self.builtins.register(tool)
        self.refresh()

    def add_source(self, source: ToolSource) -> None:
        """Add a source; its names resolve after the built-ins and earlier added sources."""
        self._added.append(source)
        self.refresh()

    def load_all(self) -> ToolsChange | None:
        """Scan the whole directory; returns the change, or None when nothing changed."""
        version = self.version
        if self.files is not None:
            self.files.load_all()
        self.refresh()
        return self._last if self._version != version else None

    async def wait_for_version(self, version: int, timeout: float | None = None) -> int:  # noqa: ASYNC109
        """Wait until `self.version >= version`; TimeoutError after `timeout` seconds."""
        async with asyncio.timeout(timeout):
            while self.version < version:
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
        if self.files is None:
            log.error("tools directory %s does not exist: not watching it", self.directory)
            return
        await self.files.watch(
            stop_event,
            force_polling=force_polling,
            debounce_ms=debounce_ms,
            step_ms=step_ms,
            poll_delay_ms=poll_delay_ms,
        )

    def refresh(self) -> ToolsChange | None:
        """Merge the sources again if one changed since the last look; the change, or None."""
        sources = self.sources
        seen = tuple((id(source), source.version) for source in sources)
        if seen == self._seen:
            return None
        self._seen = seen
        tools: dict[str, _Resolved] = {}
        problems: dict[str, builtins.list[str]] = {}
        for source in sources:
            for name, definition in source.definitions().items():
                problem = self._admit(tools, source, definition)
                if problem:
                    problems.setdefault(definition.source, []).append(f"'{name}': {problem}")
        errors: dict[str, str] = {}
        for source in sources:
            errors.update(source.errors)
        for origin, found in problems.items():
            text = "; ".join(found)
            errors[origin] = (
                f"{errors[origin]}; {text}" if origin in errors else f"{origin}: {text}"
            )
        return self._swap(tools, errors, problems)

    def _files_changed(self, change: DirectoryChange) -> None:
        self.refresh()

    def _swap(
        self,
        tools: dict[str, _Resolved],
        errors: dict[str, str],
        problems: Mapping[str, Sequence[str]],
    ) -> ToolsChange | None:
        change = DirectoryChange.between(
            self._version + 1, self._tools, tools, self._errors, errors
        )
        if change is None:
            return None
        for origin in change.failed:
            if origin in problems:  # a source logs its own errors
                log.warning("tools of %s not loaded: %s", origin, "; ".join(problems[origin]))
        self._tools, self._errors = tools, errors
        self._version += 1
        self._last = change
        self._changed.set()
        self._changed = asyncio.Event()
        log.debug("tool registry version %d: %s", self._version, change)
        if self.on_change is not None:
            try:
                self.on_change(change)
            except Exception:
                log.exception("tool registry on_change callback failed")
        return change

    @staticmethod
    def _admit(tools: dict[str, _Resolved], source: ToolSource, definition: ToolDefinition) -> str:
        """Add `definition` of `source` to `tools`; why it cannot join them ("" when it did)."""
        name = definition.name
        if name in PLANNING_DEFINITIONS:
            return "is a planning tool of PLAN_EXECUTE and cannot be redefined"
        existing = tools.get(name)
        if existing is not None:
            runs_in = existing.runs_in
            if runs_in is None or existing.redescribed or source.executes:
                return f"already defined in {existing.definition.source}"
            if definition.kind != "backend":
                return f"is a {runs_in.name} backend tool; only a .backend file may redefine it"
            if definition.timeout_s is None:
                definition = replace(definition, timeout_s=existing.definition.timeout_s)
            if definition.origin is None:
                definition = replace(definition, origin=existing.definition.origin)
            tools[name] = _Resolved(definition, runs_in, redescribed=True)
            return ""
        if definition.kind == "backend" and not source.executes:
            return "no such built-in backend tool (a .backend file can only describe built-ins)"
        runs = source.executes and definition.kind == "backend"
        tools[name] = _Resolved(definition, source if runs else None)
        return ""
