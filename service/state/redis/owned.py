"""The runs a replica executes (it is their *owner*), as the parts of its bus share them.

Each is an `Owned`: the run, the fence token it was registered with, and its events
not yet appended to its stream (the outbox's); after Redis lost its data, whether it
waits to be re-asserted and then to have its whole stream appended again
(`epoch.py`). `OwnedRuns` holds them by id, and says when each ended here
(`wait_freed`, for `RunBus.wait_ended`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from service.core.events import Event
from service.core.run.state import RunState


@dataclass(slots=True, eq=False)
class Owned:
    """A run this replica executes: its fence token and its events not yet appended."""

    run: RunState
    fence: int
    pending: list[Event] = field(default_factory=list)  # not yet appended (as far as known)
    sent: int = 0  # how many of `pending`, from its start, are in appends under way
    generation: int = 0  # moves on when what is under way is to be sent again (the outbox's)
    drained: asyncio.Event = field(default_factory=asyncio.Event)  # nothing pending
    published_end: bool = False  # the run's end is in Redis
    fenced: bool = False  # another replica took the run over
    restore: bool = False  # Redis lost the run: its events wait until it is re-asserted
    resend: bool = False  # re-asserted: its whole log is to be appended again
    handed_over: bool = False  # stopped here as the replica drains, for another to resume

    def __post_init__(self) -> None:
        self.drained.set()

    @property
    def live(self) -> bool:
        """Whether its lease is still to be renewed."""
        return not (self.fenced or self.published_end or self.handed_over)

    async def wait_drained(self, timeout_s: float) -> bool:
        """Wait until what was handed over so far is appended; False on time-out."""
        try:
            async with asyncio.timeout(timeout_s):
                await self.drained.wait()
        except TimeoutError:
            return False
        return True


class OwnedRuns:
    """The runs this replica executes, by id, until they are released."""

    def __init__(self) -> None:
        self._runs: dict[str, Owned] = {}
        self._chats: dict[str, Owned] = {}  # chat id -> its latest run here
        self._freed: dict[str, asyncio.Event] = {}  # run id -> set once the run ended

    def add(self, owned: Owned) -> None:
        self._runs[owned.run.run_id] = owned
        self._chats[owned.run.chat_id] = owned
        self._freed[owned.run.run_id] = asyncio.Event()

    def get(self, run_id: str) -> Owned | None:
        return self._runs.get(run_id)

    def __contains__(self, run_id: str) -> bool:
        return run_id in self._runs

    def live(self) -> list[Owned]:
        """Those whose leases are still to be renewed."""
        return [owned for owned in self._runs.values() if owned.live]

    def here(self, run_id: str) -> RunState | None:
        """The run when this replica executes it (and was not fenced out of it)."""
        owned = self._runs.get(run_id)
        return owned.run if owned is not None and not owned.fenced else None

    def running_on(self, chat_id: str) -> RunState | None:
        """The run this replica executes on the chat, while it goes on here."""
        owned = self._chats.get(chat_id)  # a chat's latest run here: the one that may run
        if owned is None or owned.fenced or owned.run.done:
            return None
        return owned.run

    def local(self, run_id: str) -> RunState | None:
        owned = self._runs.get(run_id)
        return owned.run if owned is not None else None

    def local_runs(self) -> Mapping[str, RunState]:
        return {run_id: owned.run for run_id, owned in self._runs.items()}

    def free(self, run_id: str) -> None:
        """The run ended here (or was taken over): whoever waits for its end goes on."""
        freed = self._freed.pop(run_id, None)
        if freed is not None:
            freed.set()

    async def wait_freed(self, run_id: str) -> None:
        freed = self._freed.get(run_id)
        if freed is not None:
            await freed.wait()

    def forget(self, run_id: str) -> None:
        owned = self._runs.pop(run_id, None)
        if owned is not None and self._chats.get(owned.run.chat_id) is owned:
            del self._chats[owned.run.chat_id]
