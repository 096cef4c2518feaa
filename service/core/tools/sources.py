"""Tool sources: where the tools of the `ToolRegistry` come from.

A `ToolSource` is a named source that lists `ToolDefinition`s and, if it
executes tools, gives the implementation (`ToolHandler`) of each backend tool it
defines. Two sources exist:

- `BuiltinTools`: the backend tools implemented in code (`BackendTool`s).
- `ToolFiles`: the tool files of a directory (`*.backend`, `*.action`, `*.html`,
  `*.qlc`, `*.dqlc`), watched and reloaded (a `DirectoryRegistry`).

A source either executes (it can run the backend tools it defines) or only
describes (`executes` is False): a describing source's backend entry redescribes
(description, parameters, `after_call_hint`, time-out) a backend tool an earlier
executing source defines, and a backend entry with no such tool is an error
reported on its origin. That is how a `.backend` file redescribes a built-in; a
source that calls tools elsewhere (an HTTP endpoint, an MCP server) is an
executing source like the built-ins, and its definitions carry their
`ToolOrigin`. Such a source may also be an `OriginSource`: it names the origins
it stands for even while it offers no tool (an MCP server that is down), so that
an agent's `toolConfig.mcp` can name a configured server whatever its state.
The adapters live outside the core: service/toolsources/ (MCP servers, HTTP
`.backend` tools).

The registry reads a source's `version` on every resolution (each model turn, each
call) and reads its tools again when it changed, so a source whose tools change
while a run goes on is seen on the run's next turn. Adding a tool source is a
new module implementing `ToolSource` plus one registration: an entry in the
`sources` of the `ToolRegistry` the service builds (service/assembly/app.py), or
`ToolRegistry.add_source`. Sources resolve in order: the built-ins, the added
sources, then the tool files.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from service.core.agents.directory import (
    Combined,
    DirectoryChange,
    DirectoryRegistry,
    InvalidFile,
    first_wins,
)
from service.core.tools.definitions import (
    ToolDefinition,
    ToolDefinitionError,
    ToolOrigin,
    kind_of,
    load_tool_file,
    view_files,
)

log = logging.getLogger("agw.tools")


class ProgressReport(Protocol):
    """Reports a running call's progress: a `tool.progress` event per call
    (service/core/run/progress.py). `stream` says where the message comes from:
    "stdout" or "stderr" for a line of a command's output, "progress" otherwise."""

    def __call__(
        self,
        message: str = "",
        *,
        progress: float | None = None,
        total: float | None = None,
        stream: str = "progress",
    ) -> None: ...


class FileReport(Protocol):
    """Announces a file the call wrote in the chat's workspace: `file.create` (`created`)
    or `file.update` (service/core/run/progress.py)."""

    def __call__(self, path: str, size_bytes: int, mime_type: str, *, created: bool) -> None: ...


@dataclass(frozen=True, slots=True)
class ToolCallInfo:
    """What a tool implementation knows about the call it serves."""

    run_id: str
    chat_id: str
    tool_id: str
    tool_name: str
    task_id: str = ""
    # Ask the user a question and wait for the answer (question.ask / Submit):
    # `questions.ask` without its first two arguments (question, options, ...).
    ask: Callable[..., Awaitable[Any]] | None = None
    agent_key: str = ""  # the agent whose stage made the call
    # Report how far the call got, while it runs (tool.progress); None: not reported.
    progress: ProgressReport | None = None
    # Announce the files the call wrote in the chat's workspace; None: not announced.
    files: FileReport | None = None


class ToolHandler(Protocol):
    """A backend tool's implementation: the parsed arguments in, a JSON-compatible result out."""

    def __call__(self, arguments: dict[str, Any], call: ToolCallInfo) -> Awaitable[Any]: ...


@dataclass(frozen=True, slots=True)
class BackendTool:
    """A built-in backend tool: its default definition and its implementation."""

    definition: ToolDefinition
    handler: ToolHandler


class ToolSource(Protocol):
    """A named source of tools, read by the `ToolRegistry` whenever its `version` moved.

    Each definition's `source` says where it comes from (a file name, a server):
    the registry reports a definition it refuses under that name.
    """

    @property
    def name(self) -> str:
        """The source as named in messages ("built-in", "tool files", …)."""
        ...

    @property
    def executes(self) -> bool:
        """Whether it runs its backend tools (False: it only describes tools)."""
        ...

    @property
    def version(self) -> int:
        """Increments whenever `definitions()`, `errors` or a handler changes."""
        ...

    @property
    def errors(self) -> Mapping[str, str]:
        """Origin (a file, a server) → why (some of) its tools are not loaded as written."""
        ...

    def definitions(self) -> Mapping[str, ToolDefinition]:
        """The tools it defines now, by name, in its order."""
        ...

    def handler(self, name: str) -> ToolHandler | None:
        """The implementation of backend tool `name` (None: it has none)."""
        ...


@runtime_checkable
class OriginSource(Protocol):
    """A source that stands for outside origins (e.g. one MCP server), known even when idle."""

    @property
    def origins(self) -> Sequence[ToolOrigin]:
        """The origins whose tools it gives, whether or not it gives any now."""
        ...


def mcp_origin_id(server: str) -> str:
    """The `ToolOrigin.source_id` of the tools of MCP server `server`."""
    return f"mcp:{server}"


class BuiltinTools:
    """The backend tools implemented in code."""

    name = "built-in"
    executes = True

    def __init__(self, tools: Iterable[BackendTool] = ()) -> None:
        self._tools: dict[str, BackendTool] = {t.definition.name: t for t in tools}
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    @property
    def errors(self) -> Mapping[str, str]:
        return {}

    def register(self, tool: BackendTool) -> None:
        """Add or replace a built-in backend tool."""
        self._tools = {**self._tools, tool.definition.name: tool}
        self._version += 1

    def definitions(self) -> Mapping[str, ToolDefinition]:
        return {name: tool.definition for name, tool in self._tools.items()}

    def handler(self, name: str) -> ToolHandler | None:
        tool = self._tools.get(name)
        return tool.handler if tool is not None else None


def is_tool_file(path: Path) -> bool:
    """Whether a file name is a tool file (a known suffix, not a dotfile or editor temp)."""
    name = path.name
    return (
        kind_of(path) is not None
        and not name.startswith((".", "#", "~"))
        and len(name) > len(path.suffix)
    )


class ToolFileKind:
    """Tool files: several tools per file, the kind set by the suffix; a name defined twice
    keeps its first definition (files in name order) and is reported on the later file."""

    noun = "tool"

    def relevant(self, path: Path) -> bool:
        return is_tool_file(path)

    def load(self, path: Path) -> Sequence[ToolDefinition]:
        try:
            return load_tool_file(path)
        except ToolDefinitionError as exc:
            raise InvalidFile(str(exc)) from exc

    def combine(self, files: Mapping[str, Sequence[ToolDefinition]]) -> Combined[ToolDefinition]:
        return first_wins(files, lambda tool: tool.name)


class ToolFiles(DirectoryRegistry[ToolDefinition]):
    """The tool files of a directory: a describing source (its tools run elsewhere).

    A frontend tool's view is read when its file loads, so the watch covers the
    directory's folders too: a changed view file reloads every tool file that names it.
    """

    name = "tool files"
    executes = False
    recursive = True

    def __init__(
        self, directory: Path, *, on_change: Callable[[DirectoryChange], None] | None = None
    ) -> None:
        super().__init__(directory, ToolFileKind(), on_change=on_change, logger=log)
        self._root = self.directory.resolve()
        self._views: dict[str, frozenset[Path]] = {}  # tool file → the view files it names

    def entry_of(self, path: Path) -> str | None:
        """A tool file of the directory itself (a view in a folder may end in `.html` too)."""
        in_root = path.parent.resolve() == self._root
        return path.name if in_root and self.loader.relevant(path) else None

    def entries_of(self, path: Path) -> set[str]:
        entries = super().entries_of(path)
        if self._views:
            changed = path.resolve()
            entries |= {name for name, views in self._views.items() if changed in views}
        return entries

    def refresh(self, names: Iterable[str]) -> DirectoryChange | None:
        """Reload the named files, noting the view files each names."""
        names = sorted(names)
        for name in names:
            views = view_files(self.directory / name)
            if views:
                self._views[name] = views
            else:
                self._views.pop(name, None)
        return super().refresh(names)

    def definitions(self) -> Mapping[str, ToolDefinition]:
        return self.items

    def handler(self, name: str) -> ToolHandler | None:
        return None
