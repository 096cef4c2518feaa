"""A full disk under the file backends: every write is whole or refused, loudly.

The disk is a small tmpfs mounted for each test (that takes root: the tests are
skipped, saying why, where one cannot be mounted), filled up with a file of filler
while the service runs, then freed. A tmpfs writes part of a buffer when only part
of it fits and fails the next write: the short write the chat store must catch.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from agw.v1 import gateway_pb2 as gw

from service.core.errors import StoreFailed
from service.core.events import run_complete
from service.providers.loopback import Gate, LoopbackProvider
from service.state.files.run_log import FileRunLog
from tests.core.tools.kit import agent, answer_turn, call_turn, kinds, tool_gateway, tools
from tests.transport.test_query import error_info

DISK_SIZE = "512k"
ECHOED = "a" * 6000  # a step record with it does not fit in what a page has left


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of DISK_SIZE mounted for the test."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a small disk of its own (a tmpfs) can only be mounted by root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_SIZE}", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def fill(disk: Path) -> Path:
    """Take every free byte of `disk` with a file of filler; the file."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as error:
        assert error.errno == errno.ENOSPC, error
    finally:
        os.close(fd)
    for size in (1024, 256, 64, 1):  # the last bytes of the last page too
        fd = os.open(disk / f"filler{size}", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(fd, b"\0" * size):
                pass
        except OSError as error:
            assert error.errno == errno.ENOSPC, error
        finally:
            os.close(fd)
    return filler


def free(disk: Path) -> None:
    for filler in disk.glob("filler*"):
        filler.unlink()


def replayed(chat: gw.GetChatResponse) -> list[list[str]]:
    """The chat's history, run by run, as event types."""
    runs: dict[str, list[str]] = {}
    for event in chat.events:
        runs.setdefault(event.run_id, []).append(event.type)
    return list(runs.values())


async def test_a_disk_filled_during_a_run_fails_it_and_tears_no_chat_line(
    tmp_path: Path, disk: Path, provider: LoopbackProvider, caplog: pytest.LogCaptureFixture
) -> None:
    chats = disk / "chats"
    agents = {"react": agent("REACT", toolConfig=tools("echo"))}
    async with tool_gateway(tmp_path, provider, agents, chats_dir=chats) as gateway:
        provider.enqueue(answer_turn("one"), answer_turn("two"))
        first = await gateway.query("react", "first")
        chat_id = first[0].chat_id
        second = await gateway.query("react", "second", chat_id=chat_id)
        assert kinds(second)[-1] == "run.complete"

        # The third run calls echo twice; its first step is written when the second call's
        # result is in, and by then the disk is full; so is its last step, at its end. No
        # third model turn is scripted.
        held = Gate(asyncio.Event())
        echo = json.dumps({"text": ECHOED})
        provider.enqueue(
            call_turn(("call_1", "echo", echo)), [held, *call_turn(("call_2", "echo", echo))]
        )
        request = gw.QueryRequest(agent_key="react", message="third", chat_id=chat_id)
        third = []
        with caplog.at_level(logging.ERROR, "agw.store"):
            async for event in gateway.stub.Query(request):
                third.append(event)
                if event.type == "tool.result" and not held.event.is_set():
                    path = chats / f"{chat_id}.json"
                    before = path.read_bytes()
                    fill(disk)
                    held.event.set()
        calls = ["tool.start", "tool.args", "tool.args", "tool.end", "tool.result"]
        assert kinds(third) == ["request.query", "run.start", *calls, *calls, "run.error"]
        error = third[-1].run_error.error
        assert error.reason == "STORE_FAILED"
        assert f"could not append to chat {chat_id!r}" in error.message
        assert "No space left on device" in error.message
        assert f"run {third[0].run_id}: could not record it in chat {chat_id}" in caplog.text
        await gateway.app.frontdoor.flush()
        # Each record failed whole: the file is as before the fill, but for the run's last
        # record (its terminal event, no messages) when it fitted in the page's last bytes.
        after = path.read_bytes()
        assert after.startswith(before) and before.endswith(b"\n")
        ended = [json.loads(line) for line in after[len(before) :].splitlines()]
        assert [e["_end"]["runError"]["error"]["reason"] for e in ended] in ([], ["STORE_FAILED"])
        assert all(e["runId"] == third[0].run_id and e["messages"] == [] for e in ended)

        free(disk)
        provider.enqueue(answer_turn("four"))
        fourth = await gateway.query("react", "fourth", chat_id=chat_id)
        assert kinds(fourth)[-1] == "run.complete"
        await gateway.app.frontdoor.flush()
        chat = await gateway.stub.GetChat(gw.GetChatRequest(chat_id=chat_id))

    done = ["request.query", "run.start", "content.snapshot", "run.complete"]
    assert replayed(chat) == [
        ["request.query", "chat.start", *done[1:]],
        done,
        ["request.query", "run.start"] + ["run.error"] * len(ended),  # no step of it kept
        done,
    ]
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""  # the file ends on a line boundary
    records = [json.loads(line) for line in lines[:-1]]  # every line whole
    assert [(r["_type"], r["runId"]) for r in records] == [
        ("query", first[0].run_id),
        ("step", first[0].run_id),
        ("query", second[0].run_id),
        ("step", second[0].run_id),
        ("query", third[0].run_id),
        *[("step", third[0].run_id)] * len(ended),
        ("query", fourth[0].run_id),
        ("step", fourth[0].run_id),
    ]
    assert provider.requests[-1]["messages"][-1] == {"role": "user", "content": "fourth"}


async def test_an_upload_that_does_not_fit_is_refused_and_leaves_nothing(
    tmp_path: Path, disk: Path, provider: LoopbackProvider
) -> None:
    uploads = disk / "uploads"
    async with tool_gateway(
        tmp_path, provider, {"react": agent("REACT")}, uploads_dir=uploads
    ) as gateway:
        kept = await gateway.stub.Upload(gw.UploadRequest(name="kept.txt", content=b"kept"))
        filler = disk / "filler"
        filler.write_bytes(b"\0" * (400 * 1024))  # some 100 KiB left
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await gateway.stub.Upload(gw.UploadRequest(name="big.bin", content=b"x" * 200_000))
        assert caught.value.code() == grpc.StatusCode.INTERNAL
        assert error_info(caught.value).reason == "STORE_FAILED"
        assert "No space left on device" in caught.value.details()
        assert [p.name for p in uploads.iterdir()] == [kept.reference.id]  # nothing half-made
        free(disk)
        again = await gateway.stub.Upload(gw.UploadRequest(name="big.txt", content=b"x" * 200_000))
        provider.enqueue(answer_turn("read"))
        both = [kept.reference, again.reference]
        assert kinds(await gateway.query("react", "read", references=both))[-1] == "run.complete"
    parts = provider.requests[-1]["messages"][-1]["content"]
    assert parts[1] == {"type": "text", "text": "[file kept.txt]\nkept"}
    assert parts[2]["text"].startswith("[file big.txt (truncated)]\nxxxx")


async def test_a_run_log_that_does_not_fit_is_refused_and_the_kept_ones_stay_whole(
    disk: Path,
) -> None:
    def events(run_id: str, size: int) -> list:
        event = run_complete("stop", None)
        event.seq, event.run_id, event.type = 1, run_id, "run.complete"
        event.run_complete.finish_reason = "x" * size
        return [event]

    run_log = FileRunLog(disk / "runs", ttl_s=3600)
    await run_log.open()
    try:
        await run_log.save("0000000000000001", events("0000000000000001", 1000))
        fill(disk)
        with pytest.raises(StoreFailed, match="could not keep the log of run '0000000000000002'"):
            await run_log.save("0000000000000002", events("0000000000000002", 300_000))
        kept = await run_log.load("0000000000000001")
        assert kept is not None and kept[0].run_complete.finish_reason == "x" * 1000
        assert await run_log.load("0000000000000002") is None
        free(disk)
        await run_log.save("0000000000000002", events("0000000000000002", 300_000))
        again = await run_log.load("0000000000000002")
        assert again is not None and len(again[0].run_complete.finish_reason) == 300_000
    finally:
        await run_log.close()


async def test_a_journal_event_that_does_not_fit_is_refused_and_leaves_no_torn_record(
    disk: Path,
) -> None:
    """The run journal's segment: a batch of events the disk cannot take is refused whole
    (a short write cut back), and what follows once there is room reads whole."""
    from service.core import events
    from service.core.run.journal import JournalEntry, entries_of
    from service.state.files.journal import FileRunJournal

    def numbered(first: int, *texts: str) -> list[events.Event]:
        made = [events.content_delta("c_1", text) for text in texts]
        for seq, event in enumerate(made, first):
            event.seq, event.run_id, event.type = seq, "r1", "content.delta"
        return made

    journal = FileRunJournal(disk)
    await journal.open()
    try:
        begun = JournalEntry("r1", "begin", "c1", json.dumps({"agentKey": "a"}).encode())
        kept = numbered(1, "before")
        assert journal.write_now([begun])
        assert journal.write_now(entries_of("r1", kept))
        fill(disk)
        with pytest.raises(OSError) as refused:
            journal.write_now(entries_of("r1", numbered(2, "x" * 6000, "y" * 6000)))
        assert refused.value.errno == errno.ENOSPC
        free(disk)
        after = numbered(2, "after")
        assert journal.write_now(entries_of("r1", after))
        read = await journal.load("r1")
        assert read is not None and read.events == kept + after
    finally:
        await journal.close()
    again = FileRunJournal(disk)
    await again.open()
    try:
        read = await again.load("r1")
        assert read is not None and read.events == kept + after
    finally:
        await again.close()
