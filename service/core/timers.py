"""One shared timer per event loop for the deadlines every run and stream holds.

Each open stream holds a few deadlines that almost never fire: its heartbeat, its
provider's read time-out, its run's time budget. A loop timer costs about half a
kilobyte (uvloop's handle, its libuv timer, a copy of the context, the bound callback
and its arguments); an `asyncio.timeout` twice that. Here every deadline of the loop
is a small entry on one heap, and the loop holds a single timer, armed for the
earliest of them: an entry costs its slots and the callback it is given.

The timer is coarse: a deadline fires up to `GRAIN_S` late, so that deadlines close
to each other fire in one wake-up. Callbacks run in the order of their deadlines, in
an empty context of the timer's own (not the one they were armed in: a callback that
needs a context variable takes the context it needs along); one that raises is
reported to the loop's exception handler, and the others still run.

A cancelled entry lets go of its callback at once, and the heap is compacted once
cancelled entries are half of it, so that a cancelled deadline keeps nothing of its
owner alive until the time it would have fired.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import math
from collections.abc import Callable
from types import TracebackType

#: How late a deadline may fire, at most (beyond the loop's own lateness).
GRAIN_S = 0.01
#: The heap is compacted once more than this many of its entries are cancelled, and they
#: are more than half of it (or all of it).
COMPACT_AFTER = 32


class Timer:
    """A deadline on the shared timer: `callback()` at loop time `when`, unless cancelled."""

    __slots__ = ("_owner", "callback", "when")

    def __init__(self, owner: SharedTimer, when: float, callback: Callable[[], object]) -> None:
        self._owner: SharedTimer | None = owner
        self.when = when
        self.callback: Callable[[], object] | None = callback

    def __lt__(self, other: Timer) -> bool:
        return self.when < other.when

    def cancel(self) -> None:
        """Do not call the callback (it is let go of now); nothing happens if it was."""
        owner, self._owner = self._owner, None
        self.callback = None
        if owner is not None:
            owner._cancelled_one()

    @property
    def cancelled(self) -> bool:
        """Whether it was cancelled, or has fired."""
        return self.callback is None


class SharedTimer:
    """The deadlines of one event loop, on one loop timer (see the module docstring)."""

    __slots__ = ("_armed_at", "_cancelled", "_context", "_handle", "_heap", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[Timer] = []
        self._handle: asyncio.Handle | None = None
        self._armed_at = math.inf  # when the loop timer fires (inf: not armed)
        self._cancelled = 0  # the heap's entries cancelled since they were pushed
        # The loop timer runs in a context of its own: one it would copy from whoever armed
        # it would keep that caller's context variables alive, from one arming to the next.
        self._context = contextvars.Context()

    def __len__(self) -> int:
        """The deadlines pending."""
        return len(self._heap) - self._cancelled

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        """Call `callback()` at loop time `when` (or up to `GRAIN_S` later)."""
        timer = Timer(self, when, callback)
        heapq.heappush(self._heap, timer)
        if when < self._armed_at:
            self._arm(when)
        return timer

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        """Call `callback()` in `delay` seconds (or up to `GRAIN_S` later)."""
        return self.call_at(self._loop.time() + delay, callback)

    def _arm(self, when: float) -> None:
        """Have the loop wake the timer at `when`, rounded up to the grain."""
        if self._handle is not None:
            self._handle.cancel()
        at = self._armed_at = max(math.ceil(when / GRAIN_S) * GRAIN_S, when)
        loop = self._loop
        if at <= loop.time():
            self._handle = loop.call_soon(self._fire, context=self._context)
        else:
            self._handle = loop.call_at(at, self._fire, context=self._context)

    def _cancelled_one(self) -> None:
        self._cancelled += 1
        heap, cancelled = self._heap, self._cancelled
        if cancelled == len(heap) or (cancelled > COMPACT_AFTER and cancelled * 2 > len(heap)):
            heap[:] = [timer for timer in heap if timer.callback is not None]
            heapq.heapify(heap)
            self._cancelled = 0
            if not heap and self._handle is not None:  # nothing left to wake up for
                self._handle.cancel()
                self._handle = None
                self._armed_at = math.inf

    def _fire(self) -> None:
        limit = max(self._loop.time(), self._armed_at)
        self._handle = None
        self._armed_at = -math.inf  # while the callbacks run: armed again at the end
        heap = self._heap
        while heap and heap[0].when <= limit:
            timer = heapq.heappop(heap)
            callback, timer.callback, timer._owner = timer.callback, None, None
            if callback is None:
                self._cancelled -= 1
                continue
            try:
                callback()
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as error:
                self._loop.call_exception_handler(
                    {
                        "message": f"Exception in the callback {callback!r} of a shared timer",
                        "exception": error,
                    }
                )
        while heap and heap[0].callback is None:  # a cancelled one needs no wake-up
            heapq.heappop(heap)
            self._cancelled -= 1
        self._armed_at = math.inf
        if heap:
            self._arm(heap[0].when)


# Each loop's shared timer. (Not weakly keyed: a timer refers to its loop. The timers of
# closed loops are dropped when the next one is made.)
_timers: dict[asyncio.AbstractEventLoop, SharedTimer] = {}


def shared_timer() -> SharedTimer:
    """The running loop's shared timer."""
    loop = asyncio.get_running_loop()
    timer = _timers.get(loop)
    if timer is None:
        for closed in [other for other in _timers if other.is_closed()]:
            del _timers[closed]
        timer = _timers[loop] = SharedTimer(loop)
    return timer


class Deadline:
    """`asyncio.timeout` on the shared timer: the enclosed block is cancelled at its
    deadline, and the cancellation leaves the block as `TimeoutError` — unless the task
    was also cancelled from elsewhere, which then goes on as `CancelledError`."""

    __slots__ = ("_cancelling", "_delay", "_expired", "_task", "_timer")

    def __init__(self, delay: float | None) -> None:
        self._delay = delay
        self._task: asyncio.Task[object] | None = None
        self._timer: Timer | None = None
        self._expired = False
        self._cancelling = 0

    def expired(self) -> bool:
        """Whether the deadline came while the block ran."""
        return self._expired

    async def __aenter__(self) -> Deadline:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        if self._delay is not None:
            self._timer = shared_timer().call_later(self._delay, self._on_deadline)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task, self._task = self._task, None
        if (  # (the deadline's cancellation is taken back; any other one goes on)
            self._expired
            and task is not None
            and task.uncancel() <= self._cancelling
            and exc_type is asyncio.CancelledError
        ):
            raise TimeoutError from exc

    def _on_deadline(self) -> None:
        self._timer = None
        if self._task is not None:
            self._expired = True
            self._task.cancel()


def timeout(delay: float | None) -> Deadline:
    """Like `asyncio.timeout(delay)`, on the loop's shared timer (`delay` None: never)."""
    return Deadline(delay)
