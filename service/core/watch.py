"""Watching a directory of definition files (agents, tools) and reloading what changed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from watchfiles import Change, awatch


@dataclass(frozen=True, slots=True)
class DirectoryChange:
    """What one effective reload did: names added/updated/removed, files failed/fixed."""

    version: int
    added: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    cleared: tuple[str, ...] = ()


async def watch_files(
    directory: Path,
    stop_event: asyncio.Event,
    *,
    relevant: Callable[[Path], bool],
    load_all: Callable[[], object],
    refresh: Callable[[set[str]], object],
    force_polling: bool | None = None,
    debounce_ms: int = 1600,
    step_ms: int = 50,
    poll_delay_ms: int = 300,
) -> None:
    """Call `refresh(names)` with each batch of changed file names until `stop_event` is set.

    Changes are grouped until none arrives for `step_ms` (at most `debounce_ms`).
    Once the watch is in place the directory is rescanned with `load_all()`, so
    nothing changed before the watch started is missed. `force_polling` (for file
    systems without change notification) compares modification times, so it can
    miss a second write within one clock tick of the file system.
    """

    def keep(change: Change, path: str) -> bool:
        return relevant(Path(path))

    changes = awatch(
        directory,
        watch_filter=keep,
        debounce=debounce_ms,
        step=step_ms,
        stop_event=stop_event,
        force_polling=force_polling,
        poll_delay_ms=poll_delay_ms,
        recursive=False,
    )
    # The first step of `first` sets the OS watch up before it suspends, so after one
    # yield to the loop the catch-up scan cannot miss a change.
    first = asyncio.ensure_future(anext(changes))
    try:
        await asyncio.sleep(0)
        load_all()
        batch = await first
        while True:
            refresh({Path(path).name for _, path in batch})
            batch = await anext(changes)
    except StopAsyncIteration:
        pass
    finally:
        if not first.done():
            first.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await first
        await changes.aclose()
