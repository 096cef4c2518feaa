"""The shared timer: its deadlines fire in order, once, at most a grain late; a cancelled one
never fires and keeps nothing alive; `timeout` is `asyncio.timeout` on it."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import weakref
from typing import Any

import pytest

from service.core import timers
from service.core.timers import COMPACT_AFTER, GRAIN_S, SharedTimer, shared_timer

LATE_S = 0.05  # the grain, and room for a loaded machine


async def test_deadlines_fire_in_order_once_and_not_early() -> None:
    timer = shared_timer()
    loop = asyncio.get_running_loop()
    start = loop.time()
    fired: list[tuple[str, float]] = []
    done = loop.create_future()

    def note(name: str) -> None:
        fired.append((name, loop.time() - start))
        if len(fired) == 3:
            done.set_result(None)

    timer.call_later(0.06, lambda: note("c"))
    timer.call_later(0.02, lambda: note("a"))
    timer.call_at(start + 0.04, lambda: note("b"))
    assert len(timer) == 3
    await asyncio.wait_for(done, 2)
    assert [name for name, _ in fired] == ["a", "b", "c"]
    for (_, at), due in zip(fired, (0.02, 0.04, 0.06), strict=True):
        assert due - 0.002 <= at <= due + GRAIN_S + LATE_S, fired
    await asyncio.sleep(0.1)
    assert len(fired) == 3 and len(timer) == 0


async def test_a_deadline_due_now_or_past_fires_at_the_next_turns() -> None:
    fired = asyncio.get_running_loop().create_future()
    shared_timer().call_later(-1.0, lambda: fired.set_result(True))
    assert await asyncio.wait_for(fired, 1)


async def test_a_cancelled_deadline_never_fires_and_lets_go_of_its_callback() -> None:
    timer = shared_timer()
    fired: list[str] = []

    class Owner:
        def due(self) -> None:
            fired.append("owner")

    owner = Owner()
    gone = weakref.ref(owner)
    cancelled = timer.call_later(0.01, owner.due)
    kept = timer.call_later(0.02, lambda: fired.append("kept"))
    del owner
    cancelled.cancel()
    cancelled.cancel()  # twice: nothing more happens
    gc.collect()
    assert gone() is None and cancelled.cancelled and not kept.cancelled
    assert len(timer) == 1
    await asyncio.sleep(0.05 + LATE_S)
    assert fired == ["kept"] and kept.cancelled  # (fired: nothing left to cancel)
    kept.cancel()  # after it fired: nothing happens
    assert len(timer) == 0


async def test_cancelled_deadlines_do_not_pile_up() -> None:
    timer = SharedTimer(asyncio.get_running_loop())
    far = [timer.call_later(3600, lambda: None) for _ in range(10 * COMPACT_AFTER)]
    for deadline in far[: len(far) - 1]:
        deadline.cancel()
    assert len(timer) == 1
    assert len(timer._heap) <= 2 * COMPACT_AFTER + 1  # compacted as they were cancelled
    far[-1].cancel()
    assert len(timer) == 0 and not timer._heap and timer._handle is None  # no wake-up left


async def test_a_failing_callback_is_reported_and_the_others_still_run() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        fired: list[str] = []
        done = loop.create_future()

        def fail() -> None:
            raise ValueError("boom")

        timer = shared_timer()
        timer.call_later(0.01, fail)
        timer.call_later(0.01, lambda: fired.append("after"))
        timer.call_later(0.02, lambda: done.set_result(None))
        await asyncio.wait_for(done, 2)
    finally:
        loop.set_exception_handler(None)
    assert fired == ["after"]
    assert [type(r["exception"]) for r in reported] == [ValueError]


async def test_a_callback_may_arm_and_cancel_deadlines() -> None:
    timer = shared_timer()
    fired: list[str] = []
    done = asyncio.get_running_loop().create_future()
    later = timer.call_later(0.03, lambda: fired.append("cancelled"))

    def first() -> None:
        fired.append("first")
        later.cancel()
        timer.call_later(0.0, lambda: fired.append("armed now"))
        timer.call_later(0.02, lambda: done.set_result(None))

    timer.call_later(0.01, first)
    await asyncio.wait_for(done, 2)
    await asyncio.sleep(0.03)
    assert fired == ["first", "armed now"]


async def test_callbacks_run_in_the_timers_own_context() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    var.set("the arming task's")
    seen = asyncio.get_running_loop().create_future()
    shared_timer().call_later(0.0, lambda: seen.set_result(var.get()))
    assert await asyncio.wait_for(seen, 1) == "unset"


async def test_timeout_ends_the_block_with_timeout_error() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError):
        async with timers.timeout(0.03) as deadline:
            await asyncio.sleep(5)
    assert deadline.expired()
    assert 0.03 - 0.002 <= loop.time() - start <= 0.03 + GRAIN_S + LATE_S
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_timeout_not_reached_changes_nothing() -> None:
    async with timers.timeout(5) as deadline:
        await asyncio.sleep(0.01)
    assert not deadline.expired()
    async with timers.timeout(None) as never:
        await asyncio.sleep(0.01)
    assert not never.expired()
    assert len(shared_timer()) == 0  # its deadline went with the block


async def test_a_cancel_from_outside_goes_through_a_timeout() -> None:
    entered = asyncio.Event()

    async def guarded() -> None:
        async with timers.timeout(5):
            entered.set()
            await asyncio.sleep(5)

    task = asyncio.create_task(guarded())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancel_from_outside_with_the_deadline_stays_a_cancel() -> None:
    """The deadline came, and someone else cancelled the task too: as with
    `asyncio.timeout`, the block ends with `CancelledError`, not `TimeoutError`."""

    async def guarded(also_cancelled: bool) -> None:
        async with timers.timeout(5) as deadline:
            deadline._on_deadline()  # its time is up...
            if also_cancelled:
                asyncio.current_task().cancel()  # type: ignore[union-attr]
            await asyncio.sleep(5)

    with pytest.raises(TimeoutError):
        await asyncio.create_task(guarded(False))
    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(guarded(True))


def test_each_loop_has_its_own_timer_and_closed_loops_are_let_go() -> None:
    async def timer_of_this_loop() -> SharedTimer:
        return shared_timer()

    first_loop = asyncio.new_event_loop()
    first = first_loop.run_until_complete(timer_of_this_loop())
    assert first_loop.run_until_complete(timer_of_this_loop()) is first
    first_loop.close()
    second_loop = asyncio.new_event_loop()
    try:
        second = second_loop.run_until_complete(timer_of_this_loop())
    finally:
        second_loop.close()
    assert second is not first
    assert first_loop not in timers._timers  # dropped when the next loop's was made
