"""A watched directory of definition files (agents, tools), kept current while the service runs.

`DirectoryRegistry[T]` holds the items of a directory's definition files. What
a definition file is comes from its `DefinitionFiles[T]` loader: which file
names count, how one file parses into items (an agent file yields one agent, a
tool file several tools), and how the items of all files combine into one set
by key (a key defined twice is reported on the later file).

A file that cannot be read as written is recorded in `errors` and logged once
at WARNING; it never disturbs the other files, and a broken edit of a file that
was valid keeps its last valid version serving. State is swapped whole
(copy-on-write), so a reader never sees a half-applied reload. `version`
increments on each effective change: an item added, replaced or removed, or a
file's error recorded, changed or cleared; each is described by a
`DirectoryChange` given to `on_change`. Call the registry from the event loop's
thread (or before the loop runs).

An entry of the directory is one of its definition files; a registry whose
entries are folders (a skill is a folder) says which folders are entries
(`entries`) and which entry a changed path belongs to (`entry_of`), and is
watched recursively. A registry whose entries read other files (a tool file its
views) is watched recursively too and names, for a changed path, every entry
that reads it (`entries_of`).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from watchfiles import Change, awatch

log = logging.getLogger("agw.directory")

T = TypeVar("T")


class InvalidFile(Exception):
    """A definition file that cannot be loaded as written; the message says where and why."""


@dataclass(frozen=True, slots=True)
class DirectoryChange:
    """What one effective reload did: names added/updated/removed, files failed/fixed."""

    version: int
    added: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    cleared: tuple[str, ...] = ()

    @staticmethod
    def between(
        version: int,
        old_items: Mapping[str, object],
        items: Mapping[str, object],
        old_errors: Mapping[str, str],
        errors: Mapping[str, str],
    ) -> DirectoryChange | None:
        """What changed from the old items and errors to the new ones; None: nothing."""
        change = DirectoryChange(
            version,
            added=tuple(sorted(items.keys() - old_items.keys())),
            updated=tuple(
                sorted(k for k in items.keys() & old_items.keys() if items[k] != old_items[k])
            ),
            removed=tuple(sorted(old_items.keys() - items.keys())),
            failed=tuple(sorted(f for f in errors if errors[f] != old_errors.get(f))),
            cleared=tuple(sorted(old_errors.keys() - errors.keys())),
        )
        changed = change.added or change.updated or change.removed
        return change if changed or change.failed or change.cleared else None

    def describe(self) -> str:
        """The change for a log line: "added a, b; removed c" (only what happened)."""
        parts = [
            f"{what} {', '.join(names)}"
            for what, names in (
                ("added", self.added),
                ("updated", self.updated),
                ("removed", self.removed),
                ("failed", self.failed),
                ("fixed", self.cleared),
            )
            if names
        ]
        return "; ".join(parts) or "nothing"


@dataclass(slots=True)
class Combined(Generic[T]):
    """The items of all files by key, and per file what of it could not join them."""

    items: dict[str, T] = field(default_factory=dict)
    problems: dict[str, builtins.list[str]] = field(default_factory=dict)


class DefinitionFiles(Protocol[T]):
    """What the definition files of one kind are, and how they load."""

    @property
    def noun(self) -> str:
        """The kind of item, singular ("agent", "tool"): used in logs."""
        ...

    def relevant(self, path: Path) -> bool:
        """Whether `path` names a definition file (not a dotfile, editor temp, …)."""
        ...

    def load(self, path: Path) -> Sequence[T]:
        """The items of one file; InvalidFile when it is not valid (OSError as raised)."""
        ...

    def combine(self, files: Mapping[str, Sequence[T]]) -> Combined[T]:
        """The items of all files (file name → its items), by key, with the conflicts."""
        ...


def first_wins(files: Mapping[str, Sequence[T]], key: Callable[[T], str]) -> Combined[T]:
    """Files in name order, items in file order; a key defined again is reported on its file."""
    combined: Combined[T] = Combined()
    owners: dict[str, str] = {}
    for file_name in sorted(files):
        for item in files[file_name]:
            name = key(item)
            owner = owners.get(name)
            if owner is not None:
                problem = f"'{name}': already defined in {owner}"
                combined.problems.setdefault(file_name, []).append(problem)
                continue
            owners[name] = file_name
            combined.items[name] = item
    return combined


class DirectoryRegistry(Generic[T]):
    """The valid items of a directory's definition files, by key, with the files' errors."""

    def __init__(
        self,
        directory: Path,
        loader: DefinitionFiles[T],
        *,
        on_change: Callable[[DirectoryChange], None] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.loader = loader
        self.on_change = on_change
        self.log = logger or log
        self._files: dict[str, tuple[T, ...]] = {}  # the last valid parse of each file
        self._file_errors: dict[str, str] = {}  # why a file is not loaded as written
        self._items: dict[str, T] = {}
        self._errors: dict[str, str] = {}
        self._version = 0
        self._changed = asyncio.Event()

    # -- reading -----------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    @property
    def errors(self) -> dict[str, str]:
        """File name → why the file is not (or no longer) loaded as written."""
        return dict(self._errors)

    @property
    def items(self) -> Mapping[str, T]:
        """The valid items by key (a snapshot: a reload swaps in a new mapping)."""
        return self._items

    def list(self) -> builtins.list[T]:
        """The valid items, sorted by key."""
        return [self._items[key] for key in sorted(self._items)]

    async def wait_for_version(self, version: int, timeout: float | None = None) -> int:  # noqa: ASYNC109
        """Wait until `self.version >= version`; TimeoutError after `timeout` seconds."""
        async with asyncio.timeout(timeout):
            while self._version < version:
                await self._changed.wait()
        return self._version

    # -- changing ----------------------------------------------------------------------

    #: Whether entries are folders whose contents are watched too.
    recursive = False

    def entries(self) -> set[str]:
        """The names of the directory's entries now: its definition files."""
        relevant = self.loader.relevant
        return {p.name for p in self.directory.iterdir() if relevant(p) and p.is_file()}

    def entry_of(self, path: Path) -> str | None:
        """The entry a changed `path` belongs to (None: it belongs to none)."""
        return path.name if self.loader.relevant(path) else None

    def entries_of(self, path: Path) -> set[str]:
        """The entries to reload when `path` changes: the one it belongs to, if any (a
        registry whose entries read other files names those entries too)."""
        entry = self.entry_of(path)
        return {entry} if entry is not None else set()

    def load_all(self) -> DirectoryChange | None:
        """Scan the whole directory; returns the change, or None when nothing changed."""
        if self.directory.is_dir():
            present = self.entries()
        else:
            self.log.warning("%ss directory %s does not exist", self.loader.noun, self.directory)
            present = set()
        return self.refresh(present | set(self._files) | set(self._file_errors))

    def refresh(self, names: Iterable[str]) -> DirectoryChange | None:
        """Reload the named files and swap the new state in at once."""
        files, file_errors = dict(self._files), dict(self._file_errors)
        for name in sorted(names):
            path = self.directory / name
            try:
                items = tuple(self.loader.load(path))
            except FileNotFoundError:
                files.pop(name, None)
                file_errors.pop(name, None)
                continue
            except (InvalidFile, OSError) as exc:
                message = str(exc) if isinstance(exc, InvalidFile) else f"{name}: {exc}"
                if file_errors.get(name) != message:
                    kept = "keeping its last valid version" if name in files else "not loaded"
                    self.log.warning(
                        "invalid %s file %s (%s): %s", self.loader.noun, path, kept, message
                    )
                file_errors[name] = message
                continue
            file_errors.pop(name, None)
            files[name] = items
        combined = self.loader.combine(files)
        errors = dict(file_errors)
        for file_name, problems in combined.problems.items():
            text = f"{file_name}: " + "; ".join(problems)
            errors[file_name] = f"{errors[file_name]}; {text}" if file_name in errors else text
        self._files, self._file_errors = files, file_errors
        return self._swap(combined.items, errors)

    def _swap(self, items: dict[str, T], errors: dict[str, str]) -> DirectoryChange | None:
        change = DirectoryChange.between(
            self._version + 1, self._items, items, self._errors, errors
        )
        if change is None:
            return None
        for file_name in change.failed:
            if file_name not in self._file_errors:  # read errors were logged when read
                self.log.warning("%s file %s: %s", self.loader.noun, file_name, errors[file_name])
        self._items, self._errors = items, errors
        self._version += 1
        self._changed.set()
        self._changed = asyncio.Event()
        if change.added or change.updated or change.removed:
            self.log.info(
                "%ss reloaded (version %d): %s", self.loader.noun, self._version, change.describe()
            )
        if self.on_change is not None:
            try:
                self.on_change(change)
            except Exception:
                self.log.exception("%s registry on_change callback failed", self.loader.noun)
        return change

    # -- watching ----------------------------------------------------------------------

    async def watch(
        self,
        stop_event: asyncio.Event,
        *,
        force_polling: bool | None = None,
        debounce_ms: int = 1600,
        step_ms: int = 50,
        poll_delay_ms: int = 300,
    ) -> None:
        """Reload changed files until `stop_event` is set (or the task is cancelled).

        Changes are grouped until none arrives for `step_ms` (at most `debounce_ms`).
        Once the watch is in place the directory is rescanned with `load_all()`, so
        nothing changed before the watch started is missed. `force_polling` (for file
        systems without change notification) compares modification times, so it can
        miss a second write within one clock tick of the file system.
        """
        if not self.directory.is_dir():
            self.log.error(
                "%ss directory %s does not exist: not watching it",
                self.loader.noun,
                self.directory,
            )
            return

        def keep(change: Change, path: str) -> bool:
            return bool(self.entries_of(Path(path)))

        changes = awatch(
            self.directory,
            watch_filter=keep,
            debounce=debounce_ms,
            step=step_ms,
            stop_event=stop_event,
            force_polling=force_polling,
            poll_delay_ms=poll_delay_ms,
            recursive=self.recursive,
        )
        # The first step of `first` sets the OS watch up before it suspends, so after one
        # yield to the loop the catch-up scan cannot miss a change.
        first = asyncio.ensure_future(anext(changes))
        try:
            await asyncio.sleep(0)
            self.load_all()
            batch = await first
            while True:
                self.refresh({e for _, path in batch for e in self.entries_of(Path(path))})
                batch = await anext(changes)
        except StopAsyncIteration:
            pass
        finally:
            if not first.done():
                first.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await first
            await changes.aclose()
