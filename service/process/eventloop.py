"""The event loop a process of the service runs on: uvloop's where available, else asyncio's.

`AGW_EVENT_LOOP` chooses: "auto" (the default) takes uvloop when it can be
imported — it is a dependency, but has no build for every platform — and
falls back to the standard library's loop; "uvloop" insists on it (start-up
fails without it); "asyncio" is the standard library's loop. On uvloop the
same work costs less CPU: the loop's own bookkeeping and the wake-ups from
gRPC's completion-queue thread are cheaper (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar, get_args

EventLoopChoice = Literal["auto", "asyncio", "uvloop"]
LoopFactory = Callable[[], asyncio.AbstractEventLoop]
T = TypeVar("T")

CHOICES: tuple[str, ...] = get_args(EventLoopChoice)


def loop_factory(choice: str = "auto") -> LoopFactory | None:
    """The factory of the loop `choice` names; None for asyncio's own."""
    if choice not in CHOICES:
        raise ValueError(f"event loop {choice!r}: choose among {', '.join(CHOICES)}")
    if choice == "asyncio":
        return None
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        if choice == "uvloop":
            raise RuntimeError("AGW_EVENT_LOOP=uvloop, but uvloop is not installed") from None
        return None
    factory: LoopFactory = uvloop.new_event_loop
    return factory


def loop_name(choice: str = "auto") -> str:
    """ "uvloop" or "asyncio": the loop `choice` gives on this machine."""
    return "asyncio" if loop_factory(choice) is None else "uvloop"


def run(main: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """Run `main` to its end on a new loop of the kind `choice` names (like `asyncio.run`)."""
    try:
        factory = loop_factory(choice)
    except BaseException:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
