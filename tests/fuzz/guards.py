"""What must hold after fuzzing: no slot leaked, no file written outside, no alarm raised.

`assert_no_leaks` looks at the service's run slots, chats, waiting tools and
sandbox slots once every run has ended. `FileGuard` looks at the file system
around the service's directories. `Alarms` collects what went wrong unforeseen
while the service ran: ERROR log records, and failures asyncio found unhandled.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.builtins.bash import Bash

if TYPE_CHECKING:
    from tests.fuzz.kit import FuzzService

#: Files named with this are what the sandbox probes try to write outside their workspace.
MARKER = "agw-fuzz-escape"


async def assert_no_leaks(service: FuzzService) -> None:
    """No run slot, chat, waiting tool or sandbox slot is held once every run has ended."""
    app = service.app
    front = app.frontdoor
    assert front.active_runs == 0, f"{front.active_runs} run slot(s) still held"
    live = [run_id for run_id, run in front.runs.items() if not run.done]
    assert live == [], f"runs still live: {live}"
    busy = [chat for chat in service.ids.chats if await app.bus.active_of(chat) is not None]
    assert busy == [], f"chats still busy: {busy}"
    waiting = {r: app.bus.waits.waiting(r) for r in front.runs if app.bus.waits.waiting(r)}
    assert waiting == {}, f"tools still waiting: {waiting}"
    bash = app.tools.handler("_bash_")
    assert isinstance(bash, Bash)
    free = bash.slots._value  # asyncio.Semaphore shows its count only so
    assert free == bash.max_concurrent, "a sandbox slot is still held"
    assert bash.chats == {}, f"chat workspaces still held: {sorted(bash.chats)}"


class Alarms(logging.Handler):
    """What went wrong unforeseen: ERROR log records, and failures asyncio found unhandled."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        cause = f" ({type(error).__name__}: {str(error)[:200]})" if error else ""
        self.seen.append(f"{record.name}: {record.getMessage()[:300]}{cause}")

    def unhandled(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.seen.append(f"asyncio: {context.get('message')} {context.get('exception')!r}")

    @classmethod
    @contextmanager
    def raised(cls) -> Iterator[Alarms]:
        """Collect the alarms raised meanwhile (on the running loop, in every logger)."""
        alarms = cls()
        loop = asyncio.get_running_loop()
        previous = loop.get_exception_handler()
        loop.set_exception_handler(alarms.unhandled)
        logging.getLogger().addHandler(alarms)
        try:
            yield alarms
        finally:
            logging.getLogger().removeHandler(alarms)
            loop.set_exception_handler(previous)

    def check(self) -> None:
        gc.collect()  # futures report a failure nobody retrieved when they are collected
        assert self.seen == [], "\n".join(self.seen)


def layout(base: Path) -> dict[str, Path]:
    """The service's directories under `base` (three levels down, see the module docstring)."""
    root = base / "l1" / "l2" / "svc"
    return {
        "root": root,
        "agents": root / "agents",
        "tools": root / "tools",
        "data": root / "data",
        "workspace": root / "workspace",
    }


class FileGuard:
    """Whether anything was written outside the service's own directories.

    Before: the entries beside `base`, and in the current directory. After:
    everything under `base` lies in the agents, tools or data directory or in a
    chat's workspace (`workspace/chats/<chat>`), nothing appeared beside `base`
    or in the current directory, and no file carrying `MARKER` exists in the
    places a sandbox escape would reach.
    """

    def __init__(self, base: Path) -> None:
        self.base = base
        self.dirs = layout(base)
        self.cwd = Path.cwd()
        self.before = self._beside()

    def _beside(self) -> dict[str, set[str]]:
        return {
            str(path): set(os.listdir(path))
            for path in (self.base.parent, self.cwd)
            if path.is_dir()
        }

    def outside(self) -> list[str]:
        """Every path under `base` outside the service's directories and the chat workspaces."""
        chats = self.dirs["workspace"] / "chats"
        trees = [self.dirs["agents"], self.dirs["tools"], self.dirs["data"], chats]
        on_the_way = {*self.dirs["root"].parents, self.dirs["root"], self.dirs["workspace"]}
        found: list[str] = []
        for path in _walk(self.base):
            if path in on_the_way or any(path == t or t in path.parents for t in trees):
                continue
            found.append(str(path))
        return found

    def escaped(self) -> list[str]:
        """Files carrying `MARKER` anywhere a sandbox command might have written them."""
        places = [Path("/"), Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), Path.home()]
        places += [self.cwd, *self.dirs["workspace"].parents]
        found = set()
        for place in places:
            try:
                names = os.listdir(place)
            except OSError:
                continue
            found |= {str(place / name) for name in names if MARKER in name}
        return sorted(found)

    def check(self) -> None:
        assert self.outside() == [], f"written outside the service's directories: {self.outside()}"
        assert self.escaped() == [], f"sandbox escapes: {self.escaped()}"
        after = self._beside()
        appeared = {p: sorted(after[p] - names) for p, names in self.before.items() if p in after}
        assert all(not new for new in appeared.values()), f"new entries: {appeared}"


def _walk(base: Path) -> Iterator[Path]:
    for root, dirs, files in os.walk(base):
        for name in dirs + files:
            yield Path(root) / name
