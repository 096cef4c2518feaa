"""The in-process `RunBus`: live runs in a dict, Submit and Cancel delivered by a call.

One process owns every run it knows, so following a run is reading its
`EventLog`, cancelling it is cancelling its task, and a Submit resolves the
waiting tool's future directly (`service.core.run.waits.Waits`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence

from service.core.commands import SubmitCommand, SubmitResult
from service.core.events import Event
from service.core.run.state import RunState
from service.core.run.waits import Waits
from service.core.signals import Flag
from service.core.values import LiveRun, RunRef
from service.state.run_refs import live, ref


class LocalRunBus:
    """The runs of this process, and the answers and cancels addressed to them."""

    def __init__(self, waits: Waits | None = None) -> None:
        self.waits = waits if waits is not None else Waits()
        self._runs: dict[str, RunState] = {}
        self._chats: dict[str, RunState] = {}  # chat id -> its active run
        self._freed: dict[str, Flag] = {}  # run id -> set once the run ended

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def register(self, run: RunState, *, new_chat: bool = False) -> RunRef | None:
        active = self._chats.get(run.chat_id)
        if active is not None:
            return ref(active)
        self._runs[run.run_id] = run
        self._chats[run.chat_id] = run
        self._freed[run.run_id] = Flag()
        return None

    def on_lost(self, resume: Callable[[str, str], Awaitable[RunState | None]]) -> None:
        return None  # this process's runs only: their owner is never lost to it

    async def drain(self) -> None:
        return None

    async def can_hand_over(self) -> bool:
        return False  # a run handed over resumes when the service starts again

    async def hand_over(self, run: RunState) -> None:
        return None  # its journal has it, for the next process

    async def adopt(self, run: RunState) -> bool:
        return await self.register(run) is None

    async def ended(self, run: RunState) -> None:
        if self._chats.get(run.chat_id) is run:
            del self._chats[run.chat_id]
        freed = self._freed.pop(run.run_id, None)
        if freed is not None:
            freed.set()

    async def settled(self, run: RunState) -> None:
        return None  # one process: the front door waits for its own recorder

    async def release(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
        self.waits.forget(run_id)

    def local(self, run_id: str) -> RunState | None:
        return self._runs.get(run_id)

    def local_runs(self) -> Mapping[str, RunState]:
        return dict(self._runs)

    async def find(self, run_id: str) -> RunRef | None:
        run = self._runs.get(run_id)
        return ref(run) if run is not None else None

    async def active_of(self, chat_id: str) -> RunRef | None:
        run = self._chats.get(chat_id)
        return ref(run) if run is not None else None

    async def live_of(self, chat_id: str) -> LiveRun | None:
        run = self._chats.get(chat_id)
        return live(run, self.waits) if run is not None and not run.done else None

    async def wait_ended(self, run_id: str) -> None:
        freed = self._freed.get(run_id)
        if freed is not None:
            await freed.wait()

    async def wait_settled(self, chat_id: str) -> None:
        return None

    async def follow(self, run_id: str, after_seq: int) -> AsyncGenerator[Event, None] | None:
        run = self._runs.get(run_id)
        return run.follow(after_seq) if run is not None else None

    async def cancel(self, run_id: str, reason: str) -> bool | None:
        run = self._runs.get(run_id)
        return run.cancel(reason) if run is not None else None

    async def submit(self, command: SubmitCommand) -> SubmitResult:
        return self.waits.deliver(command, self._runs.get(command.run_id))

    async def forget_chat(self, chat_id: str, run_ids: Sequence[str]) -> None:
        for run_id in run_ids:
            run = self._runs.get(run_id)
            if run is None or run.done:
                await self.release(run_id)
