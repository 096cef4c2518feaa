"""`Flag`: a one-way event whose waiters are woken once, and which costs no waiters' queue."""

from __future__ import annotations

import asyncio
import sys

from service.core.signals import Flag


async def test_set_wakes_every_waiter_and_later_waits_return_at_once() -> None:
    flag = Flag()
    woken: list[int] = []

    async def waiter(i: int) -> None:
        await flag.wait()
        woken.append(i)

    tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
    await asyncio.sleep(0)
    assert not flag.is_set() and not woken
    flag.set()
    flag.set()  # a second set changes nothing
    await asyncio.gather(*tasks)
    assert sorted(woken) == [0, 1, 2] and flag.is_set()
    await asyncio.wait_for(flag.wait(), 0.1)


async def test_a_cancelled_waiter_leaves_the_others_waiting() -> None:
    flag = Flag()
    first = asyncio.create_task(flag.wait())
    second = asyncio.create_task(flag.wait())
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.wait({first})
    assert first.cancelled() and not second.done()
    flag.set()
    await asyncio.wait_for(second, 1)


async def test_a_flag_nobody_waits_for_is_smaller_than_an_event() -> None:
    event = asyncio.Event()
    flag = Flag()
    event_bytes = (
        sys.getsizeof(event)
        + sys.getsizeof(event.__dict__)
        + sum(sys.getsizeof(v) for v in vars(event).values())
    )
    assert sys.getsizeof(flag) < 100 < event_bytes
