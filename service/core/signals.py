"""`Flag`: a one-way `asyncio.Event` that costs nothing until someone waits.

Every run has a few of these (its end, its log's end, its recorder's end), and most
are set without ever being awaited. An `asyncio.Event` allocates its waiters' deque
(about 760 bytes) when it is made; a `Flag` holds two slots and makes a future per
waiter only when one waits — with thousands of runs open, that is kilobytes per run.
"""

from __future__ import annotations

import asyncio


class Flag:
    """Set once, never cleared; `wait` returns at once when set, else when it is set."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        """Set the flag and wake every waiter (a waiter cancelled meanwhile is skipped)."""
        if self._set:
            return
        self._set = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self) -> None:
        """Wait until the flag is set; cancelling one waiter leaves the others waiting."""
        if self._set:
            return
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if self._waiters is not None and not self._set:
                self._waiters.remove(waiter)
