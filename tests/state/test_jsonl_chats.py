"""The JSONL chat store: appends, torn tails, corrupt lines, crash safety, listing."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

import pytest

from service.core.errors import ChatNotFound, InvalidRequest
from service.state.files.chats import JsonlChatStore, repair_torn_tail, upgrade_record
from service.state.files.writer import DiskWriter


def query(chat: str, run: str, message: str = "hello", ts: int = 1) -> dict:
    return {
        "_type": "query",
        "chatId": chat,
        "runId": run,
        "updatedAt": ts,
        "query": {"message": message, "agentKey": "a"},
    }


def step(chat: str, run: str, seq: int, ts: int = 2) -> dict:
    return {
        "_type": "step",
        "chatId": chat,
        "runId": run,
        "_stage": "oneshot",
        "_seq": seq,
        "updatedAt": ts,
        "messages": [],
    }


async def test_append_then_read_back(tmp_path: Path) -> None:
    store = JsonlChatStore(tmp_path)
    await store.append("c1", [query("c1", "r1"), step("c1", "r1", 1)])
    await store.append("c1", [step("c1", "r1", 2)])
    records = await store.read("c1")
    assert [r["_type"] for r in records] == ["query", "step", "step"]
    assert (tmp_path / "c1.json").read_text().count("\n") == 3
    summary = await store.summary("c1")
    assert summary is not None
    assert (summary.chat_name, summary.agent_key, summary.run_count) == ("hello", "a", 1)


async def test_a_new_chat_is_listed_and_read_before_its_lazy_first_write(
    tmp_path: Path,
) -> None:
    store = JsonlChatStore(tmp_path, writer=DiskWriter(lazy_s=30.0))
    async with asyncio.timeout(5.0):
        first = asyncio.ensure_future(store.append("c1", [query("c1", "r1")]))
        await asyncio.sleep(0.05)
        assert not first.done() and not (tmp_path / "c1.json").exists()
        summary = await store.summary("c1")
        assert summary is not None and summary.chat_name == "hello"  # listed at once
        assert [r["_type"] for r in await store.read("c1")] == ["query"]  # the read took it
        await first
        await store.append("c1", [step("c1", "r1", 1)])  # the chat's file is known: no wait
        await store.sync("c1")
    assert (tmp_path / "c1.json").read_text().count("\n") == 2


async def test_a_new_chats_records_and_sync_go_to_the_disk_together(tmp_path: Path) -> None:
    store = JsonlChatStore(tmp_path, writer=DiskWriter(window_s=0.001, lazy_s=30.0))
    async with asyncio.timeout(5.0):  # the sync does not wait for the lazy write's window
        writes = asyncio.ensure_future(store.append("c1", [query("c1", "r1")]))
        await asyncio.sleep(0)
        more = asyncio.ensure_future(store.append("c1", [step("c1", "r1", 1)]))
        await asyncio.sleep(0)
        await asyncio.gather(writes, more, store.sync("c1"))
    assert [r["_type"] for r in await store.read("c1")] == ["query", "step"]


async def test_unknown_chat_and_bad_ids(tmp_path: Path) -> None:
    store = JsonlChatStore(tmp_path)
    with pytest.raises(ChatNotFound):
        await store.read("nope")
    for bad in ("../etc", "a/b", "", ".hidden", "x" * 200):
        with pytest.raises(InvalidRequest):
            await store.append(bad, [query(bad, "r")])


async def test_corrupt_lines_are_reported_and_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "c.json"
    lines = [
        json.dumps(query("c", "r1")),
        "{not json",
        '"a string"',
        json.dumps(step("c", "r1", 1)),
    ]
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING, "agw.store"):
        records = await JsonlChatStore(tmp_path).read("c")
    assert [r["_type"] for r in records] == ["query", "step"]
    assert f"{path}:2" in caplog.text and f"{path}:3" in caplog.text


async def test_torn_tail_is_cut_before_the_next_append(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(query("c", "r1")) + "\n" + '{"_type":"step","chatId":"c","ru')
    store = JsonlChatStore(tmp_path)
    await store.append("c", [step("c", "r1", 1)])
    records = await store.read("c")
    assert [r["_type"] for r in records] == ["query", "step"]
    assert (tmp_path / "c.json.torn").read_text() == '{"_type":"step","chatId":"c","ru\n'
    assert not repair_torn_tail(path)  # intact now


def test_old_field_names_are_read() -> None:
    record = upgrade_record({"_type": "step", "planSnapshot": {"planId": "p", "plan": [{"a": 1}]}})
    assert record["plan"] == {"planId": "p", "tasks": [{"a": 1}]}


async def test_list_is_newest_first_and_paged(tmp_path: Path) -> None:
    store = JsonlChatStore(tmp_path)
    for n in range(5):
        await store.append(f"c{n}", [query(f"c{n}", "r", f"chat {n}", ts=100 + n)])
    page, cursor = await store.page(2)
    assert [s.chat_id for s in page] == ["c4", "c3"]
    page, cursor = await store.page(2, cursor)
    assert [s.chat_id for s in page] == ["c2", "c1"]
    page, cursor = await store.page(2, cursor)
    assert [s.chat_id for s in page] == ["c0"] and cursor == ""
    reopened = JsonlChatStore(tmp_path)
    await reopened.open()
    assert [s.chat_id for s in (await reopened.page(10))[0]] == ["c4", "c3", "c2", "c1", "c0"]


async def test_fsync_failure_makes_the_chat_read_only(tmp_path: Path, monkeypatch) -> None:
    from service.state.files.chats import StoreFailed

    store = JsonlChatStore(tmp_path, fsync="always")

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(StoreFailed):
        await store.append("c", [query("c", "r")])
    monkeypatch.undo()
    with pytest.raises(StoreFailed, match="read-only"):
        await store.append("c", [query("c", "r2")])


async def test_no_file_is_created_or_fsynced_on_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    store = JsonlChatStore(tmp_path)
    loop_thread = threading.get_ident()
    on_loop: list[str] = []
    real_open, real_fsync = os.open, os.fsync

    def watched_open(path, flags, *args):  # type: ignore[no-untyped-def]
        if flags & os.O_CREAT and threading.get_ident() == loop_thread:
            on_loop.append(f"open(O_CREAT) {path}")
        return real_open(path, flags, *args)

    def watched_fsync(fd: int) -> None:
        if threading.get_ident() == loop_thread:
            on_loop.append("fsync")
        real_fsync(fd)

    monkeypatch.setattr(os, "open", watched_open)
    monkeypatch.setattr(os, "fsync", watched_fsync)
    chats = [f"chat{n}" for n in range(5)]
    await asyncio.gather(*(store.append(c, [query(c, "r")]) for c in chats))
    assert [await store.summary(c) is not None for c in chats] == [True] * 5
    await asyncio.gather(*(store.append(c, [step(c, "r", 1)]) for c in chats))
    await asyncio.gather(*(store.sync(c) for c in chats))  # the runs ending together
    await store.close()
    assert on_loop == []
    assert [len(await store.read(c)) for c in chats] == [2] * 5


async def test_a_failed_fsync_in_a_batch_fails_its_chat_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.state.files.chats import StoreFailed

    store = JsonlChatStore(tmp_path)
    chats = ["good1", "bad", "good2"]
    for chat in chats:
        await store.append(chat, [query(chat, "r")])
    bad = os.stat(tmp_path / "bad.json").st_ino
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.fstat(fd).st_ino == bad:
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    outcomes = await asyncio.gather(*(store.sync(c) for c in chats), return_exceptions=True)
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], StoreFailed) and "durable" in str(outcomes[1])
    monkeypatch.undo()
    with pytest.raises(StoreFailed, match="read-only"):  # never trusted again
        await store.append("bad", [step("bad", "r", 1)])
    await store.append("good1", [step("good1", "r", 1)])
    assert len(await store.read("good1")) == 2 and len(await store.read("bad")) == 1


WRITER = """
import asyncio, sys
from pathlib import Path
from service.state.files.chats import JsonlChatStore

async def main():
    store = JsonlChatStore(Path(sys.argv[1]), fsync="never")
    pad = "x" * int(sys.argv[2])

    async def writer(n):
        i = 0
        while True:
            await store.append("c", [{"_type": "step", "chatId": "c", "runId": f"w{n}",
                                      "_seq": i, "messages": [], "pad": pad}])
            i += 1
            if i == 5:
                print("ready", flush=True)

    await asyncio.gather(*(writer(n) for n in range(4)))

asyncio.run(main())
"""


@pytest.mark.parametrize("trial", range(20))
async def test_kill_9_during_concurrent_appends_never_breaks_the_chat(
    tmp_path: Path, trial: int
) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WRITER, str(tmp_path), "4000000", stdout=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    await asyncio.wait_for(process.stdout.readline(), 20)
    await asyncio.sleep(0.002 * trial)
    process.send_signal(signal.SIGKILL)
    await process.wait()

    store = JsonlChatStore(tmp_path)
    before = await store.read("c")
    assert before and all(r["_type"] == "step" for r in before)
    await store.append("c", [step("c", "after", 1)])
    after = await store.read("c")
    assert after[-1]["runId"] == "after"
    assert len(after) == len(before) + 1
    assert (tmp_path / "c.json").read_bytes().endswith(b"\n")
