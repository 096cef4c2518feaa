"""The disk writer of the file backends: their writes, grouped, in one thread.

The file stores (the JSONL chats, the run log, the spend ledger) hand their disk work
to one `DiskWriter`, which runs it in a thread of its own, so that the event loop never
waits for the disk, never creates a file and never calls fsync. (The run journal keeps
a thread of its own: its batches, which readers wait for, never queue behind an fsync.)

Work is grouped: what the stores submit while the thread is busy, and in
the short window (`window_s`) after the first submission to an idle thread, goes to
the thread as one batch — one wake-up of the thread and one wake-up of the loop for
many runs' writes, their outcomes handed back together. Work a caller waits for to go
on (a read, a delete) is `urgent`: its batch leaves at once, or as soon
as the thread is done with the batch it has. Work nobody needs done soon is `lazy`: it
waits up to `lazy_s` for other work to go with it (a new chat's first record waits for
its run's end, when the run is short: the chat's file is then created, written and
fsynced in one batch, with the run's log), and leaves with the first batch that does.

Within a batch, the work of each lane (a store) runs in the order it was submitted;
the lanes are independent. Consecutive items submitted to one `group` function of a
lane are given to it in one call — one transaction, or one fsync, for all of them —
and share its outcome.

A writer is shared by the stores of one service (the state options carry it) or owned
by one store. Its thread starts with the first batch and ends once idle for a while;
a store closing waits for what it submitted (`drain`).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

log = logging.getLogger("agw.store")

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741

#: How long work submitted to an idle writer waits for more to join it.
WINDOW_S = 0.002
#: How long lazy work waits for more to join it.
LAZY_S = 0.05
#: How long the thread waits for work before it ends.
IDLE_EXIT_S = 10.0


@dataclass(slots=True)
class _Work:
    lane: object
    func: Callable[..., Any]
    args: tuple[Any, ...]
    future: asyncio.Future[Any]
    grouped: bool = False


@dataclass(slots=True)
class _Batch:
    work: list[_Work]
    outcomes: list[tuple[asyncio.Future[Any], BaseException | None, Any]] = field(
        default_factory=list
    )


class DiskWriter:
    """One thread that runs the file stores' disk work in batches (see the module)."""

    def __init__(
        self, *, window_s: float = WINDOW_S, lazy_s: float = LAZY_S, name: str = "agw-disk"
    ) -> None:
        self.window_s = window_s
        self.lazy_s = lazy_s
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: queue.SimpleQueue[_Batch] = queue.SimpleQueue()
        self._lock = threading.Lock()  # who starts the thread, and when it may stop
        self._thread: threading.Thread | None = None
        self._pending: list[_Work] = []
        self._busy = False  # a batch is in the thread
        self._handle: asyncio.TimerHandle | asyncio.Handle | None = None
        self._due = 0.0  # when the pending batch leaves (the loop's time), if `_handle`
        self._urgent = False  # the pending batch leaves at once
        self._lazy = True  # all the pending work is lazy
        self._idle: asyncio.Event | None = None  # set while nothing is pending or running

    # -- work --------------------------------------------------------------------------

    def call(
        self,
        lane: object,
        func: Callable[..., T],
        *args: Any,
        urgent: bool = False,
        lazy: bool = False,
    ) -> asyncio.Future[T]:
        """`func(*args)` in the writer's thread, after the lane's earlier work; its result."""
        return self._submit(_Work(lane, func, args, self._new_future()), urgent, lazy)

    def group(
        self, lane: object, func: Callable[[list[I]], None], item: I, *, urgent: bool = False
    ) -> asyncio.Future[None]:
        """`func(items)` in the writer's thread, `items` being `item` and the items submitted
        right before or after it to the same function of the lane; done when that call is."""
        return self._submit(
            _Work(lane, func, (item,), self._new_future(), grouped=True), urgent, False
        )

    def hurry(self) -> None:
        """Let the work pending leave now rather than at the end of its window."""
        if self._pending and not self._urgent:
            self._urgent = True
            if not self._busy:
                self._schedule(0.0)

    async def drain(self) -> None:
        """Wait until everything submitted so far is done."""
        while self._pending or self._busy:
            self.hurry()
            if self._idle is None:
                self._idle = asyncio.Event()
            await self._idle.wait()

    def _new_future(self) -> asyncio.Future[Any]:
        loop = self._loop
        if loop is None or (not self._busy and loop is not asyncio.get_running_loop()):
            loop = self._loop = asyncio.get_running_loop()
        return loop.create_future()

    def _submit(self, work: _Work, urgent: bool, lazy: bool) -> asyncio.Future[Any]:
        self._pending.append(work)
        if self._idle is not None:
            self._idle.clear()
        if not lazy:
            self._lazy = False
        if urgent:
            if not self._urgent:
                self._urgent = True
                if not self._busy:  # the thread is idle: to it now, with what is pending
                    if self._handle is not None:
                        self._handle.cancel()
                    self._dispatch()
        elif not self._busy and not self._urgent:
            delay = self.lazy_s if lazy else self.window_s
            assert self._loop is not None  # (made with the work's future)
            if self._handle is None or self._loop.time() + delay < self._due:
                self._schedule(delay)  # lazy work goes with work that may not wait as long
        return work.future

    def _schedule(self, delay: float) -> None:
        assert self._loop is not None
        if self._handle is not None:
            self._handle.cancel()
        self._due = self._loop.time() + delay
        if delay > 0:
            self._handle = self._loop.call_later(delay, self._dispatch)
        else:
            self._handle = self._loop.call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._handle = None
        if self._busy or not self._pending:
            return
        work, self._pending = self._pending, []
        self._urgent = False
        self._lazy = True
        self._busy = True
        with self._lock:
            self._queue.put(_Batch(work))
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
                self._thread.start()

    def _finished(self, batch: _Batch) -> None:
        """On the loop: hand each outcome to its future, then send what piled up."""
        self._busy = False
        for future, error, result in batch.outcomes:
            if future.cancelled():
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
        if self._pending and self._lazy and not self._urgent:  # it may wait for company
            self._schedule(self.lazy_s)
        elif self._pending:  # it waited for this batch already: it leaves at once
            self._dispatch()
        elif self._idle is not None:
            self._idle.set()

    # -- the thread --------------------------------------------------------------------

    def _work(self) -> None:
        """The thread: batch after batch; it ends once idle for a while (the next batch
        starts another), so that a store nobody closes leaves no thread behind for long."""
        while True:
            try:
                batch = self._queue.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            _run(batch)
            assert self._loop is not None
            try:
                self._loop.call_soon_threadsafe(self._finished, batch)
            except RuntimeError:  # the loop is closed: nobody waits any more
                log.warning("%s: the event loop closed before a batch was handed back", self.name)


def _run(batch: _Batch) -> None:
    """Run a batch's work, lane by lane, each lane's in order; consecutive items of one
    group function in one call."""
    lanes: dict[int, list[_Work]] = {}
    for work in batch.work:
        lanes.setdefault(id(work.lane), []).append(work)
    outcomes = batch.outcomes
    for works in lanes.values():
        index = 0
        while index < len(works):
            work = works[index]
            if not work.grouped:
                try:
                    outcomes.append((work.future, None, work.func(*work.args)))
                except BaseException as error:  # handed to whoever waits for it
                    outcomes.append((work.future, error, None))
                index += 1
                continue
            end = index + 1
            while end < len(works) and works[end].grouped and works[end].func == work.func:
                end += 1
            members = works[index:end]
            failure: BaseException | None = None
            try:
                work.func([member.args[0] for member in members])
            except BaseException as error:
                failure = error
            outcomes += [(member.future, failure, None) for member in members]
            index = end
