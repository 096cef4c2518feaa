"""The file stores' disk writer: work in its thread, grouped, in order per lane."""

from __future__ import annotations

import asyncio
import threading

import pytest

from service.state.files.writer import DiskWriter


async def test_work_runs_in_the_writers_thread_in_order_per_lane() -> None:
    writer = DiskWriter(window_s=0.001)
    seen: list[tuple[str, int]] = []
    threads: set[int] = set()

    def note(lane: str, n: int) -> int:
        threads.add(threading.get_ident())
        seen.append((lane, n))
        return n * 10

    futures = [writer.call(lane, note, lane, n) for n in range(5) for lane in ("a", "b")]
    assert await asyncio.gather(*futures) == [n * 10 for n in range(5) for _ in "ab"]
    assert [n for lane, n in seen if lane == "a"] == list(range(5))
    assert [n for lane, n in seen if lane == "b"] == list(range(5))
    assert threads and threading.get_ident() not in threads
    await writer.drain()


async def test_items_submitted_together_to_a_group_function_are_one_call() -> None:
    writer = DiskWriter(window_s=0.005)
    calls: list[list[int]] = []
    await asyncio.gather(*(writer.group("lane", calls.append, n) for n in range(4)))
    assert calls == [[0, 1, 2, 3]]  # one transaction, one fsync, for all four


async def test_a_failed_group_call_fails_every_item_of_it_and_no_other_work() -> None:
    writer = DiskWriter(window_s=0.005)

    def commit(items: list[int]) -> None:
        raise OSError(5, "Input/output error")

    grouped = [writer.group("journal", commit, n) for n in range(3)]
    other = writer.call("chats", lambda: "written")
    outcomes = await asyncio.gather(*grouped, other, return_exceptions=True)
    assert [type(o) for o in outcomes[:3]] == [OSError] * 3
    assert outcomes[3] == "written"


async def test_urgent_work_leaves_without_waiting_for_the_window() -> None:
    writer = DiskWriter(window_s=5.0)
    async with asyncio.timeout(1.0):
        assert await writer.call("lane", lambda: 1, urgent=True) == 1


async def test_lazy_work_waits_for_its_own_window_when_alone() -> None:
    writer = DiskWriter(window_s=0.001, lazy_s=0.2)
    loop = asyncio.get_running_loop()
    began = loop.time()
    done = writer.call("lane", lambda: loop.time(), lazy=True)
    await asyncio.sleep(0.05)
    assert not done.done()  # past the short window: it waits for company
    assert await done - began >= 0.2


async def test_lazy_work_leaves_in_the_batch_of_work_that_may_not_wait() -> None:
    writer = DiskWriter(window_s=0.005, lazy_s=5.0)
    batches: list[int] = []
    seen: list[str] = []

    def note(what: str) -> None:
        seen.append(what)

    def group(items: list[str]) -> None:
        batches.append(threading.get_ident())
        seen.extend(items)

    async with asyncio.timeout(1.0):
        lazy = writer.call("chats", note, "query", lazy=True)
        await asyncio.sleep(0.02)  # longer than the window: still pending
        assert not lazy.done()
        await asyncio.gather(lazy, writer.group("runs", group, "log"))
    assert seen == ["query", "log"] and len(batches) == 1


async def test_a_read_takes_lazy_work_along_at_once() -> None:
    writer = DiskWriter(window_s=0.005, lazy_s=5.0)
    written: list[str] = []
    async with asyncio.timeout(1.0):
        lazy = writer.call("chats", written.append, "query", lazy=True)
        assert await writer.call("chats", lambda: list(written), urgent=True) == ["query"]
        await lazy


async def test_drain_waits_for_everything_submitted() -> None:
    writer = DiskWriter(window_s=0.05)
    done: list[int] = []
    futures = [writer.call("lane", done.append, n) for n in range(3)]
    await writer.drain()
    assert done == [0, 1, 2] and all(f.done() for f in futures)


@pytest.mark.parametrize("error", [ValueError("bad"), KeyboardInterrupt()])
async def test_an_error_in_one_call_is_its_callers_alone(error: BaseException) -> None:
    writer = DiskWriter(window_s=0.001)

    def fail() -> None:
        raise error

    failing = writer.call("lane", fail)
    after = writer.call("lane", lambda: "next")
    with pytest.raises(type(error)):
        await failing
    assert await after == "next"
