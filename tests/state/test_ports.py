"""Every implementation of a state port behaves the same through the port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from service.core import events
from service.core.chats.uploads import Uploads
from service.core.errors import ChatNotFound, NotFound
from service.core.ids import ANONYMOUS, Principal
from service.core.ports import ChatStore, RunLog, UploadStore
from service.core.values import StoredUpload
from service.state import CHAT_STORES, RUN_LOGS, UPLOAD_STORES, StateOptions


def options(request: pytest.FixtureRequest, tmp_path: Path) -> StateOptions:
    """Options for the backend under test; the postgres ones get a database of their own."""
    dsn = request.getfixturevalue("postgres_dsn") if request.param == "postgres" else ""
    return StateOptions(
        chats_dir=tmp_path / "chats",
        runs_dir=tmp_path / "runs",
        uploads_dir=tmp_path / "uploads",
        postgres_dsn=dsn,
    )


def query(chat_id: str, run_id: str, message: str, ts: int) -> dict:
    return {
        "_type": "query",
        "chatId": chat_id,
        "runId": run_id,
        "updatedAt": ts,
        "query": {"message": message, "agentKey": "a"},
    }


def step(chat_id: str, run_id: str, seq: int, ts: int) -> dict:
    return {
        "_type": "step",
        "chatId": chat_id,
        "runId": run_id,
        "_stage": "oneshot",
        "_seq": seq,
        "updatedAt": ts,
        "messages": [{"role": "assistant", "content": [{"type": "text", "text": "hi"}]}],
    }


@pytest.fixture(params=sorted(CHAT_STORES))
async def chats(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ChatStore]:
    factory: Callable[[StateOptions], ChatStore] = CHAT_STORES[request.param]
    store = factory(options(request, tmp_path))
    await store.open()
    yield store
    await store.close()


@pytest.fixture(params=sorted(RUN_LOGS))
async def run_log(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[RunLog]:
    log = RUN_LOGS[request.param](options(request, tmp_path))
    await log.open()
    yield log
    await log.close()


@pytest.fixture(params=sorted(UPLOAD_STORES))
async def uploads(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[UploadStore]:
    store = UPLOAD_STORES[request.param](options(request, tmp_path))
    await store.open()
    yield store
    await store.close()


async def test_chat_store_appends_reads_summarises_and_pages(chats: ChatStore) -> None:
    assert await chats.summary("c0") is None
    with pytest.raises(ChatNotFound):
        await chats.read("c0")
    for n in range(3):
        await chats.append(f"c{n}", [query(f"c{n}", "r1", f"chat {n}", 100 + n)])
    await chats.append("c0", [step("c0", "r1", 1, 200)])
    await chats.append("c0", [query("c0", "r2", "again", 201), step("c0", "r2", 1, 202)])
    await chats.sync("c0")
    records = await chats.read("c0")
    assert [(r["_type"], r["runId"]) for r in records] == [
        ("query", "r1"),
        ("step", "r1"),
        ("query", "r2"),
        ("step", "r2"),
    ]
    summary = await chats.summary("c0")
    assert summary is not None
    assert (summary.chat_name, summary.agent_key, summary.run_count) == ("chat 0", "a", 2)
    assert (summary.created_at, summary.updated_at) == (100, 202)
    page, cursor = await chats.page(2)
    assert [s.chat_id for s in page] == ["c0", "c2"] and cursor
    page, cursor = await chats.page(2, cursor)
    assert [s.chat_id for s in page] == ["c1"] and cursor == ""


async def test_chat_store_returns_records_not_shared_with_the_caller(chats: ChatStore) -> None:
    record = query("c", "r", "hello", 1)
    await chats.append("c", [record])
    record["query"]["message"] = "changed"
    (read,) = await chats.read("c")
    assert read["query"]["message"] == "hello"


async def test_run_log_keeps_the_events_of_ended_runs(run_log: RunLog) -> None:
    assert await run_log.load("0123456789abcdef") is None
    log = [events.run_start("a"), events.run_complete("stop")]
    for seq, event in enumerate(log, 1):
        event.seq, event.run_id, event.type = seq, "0123456789abcdef", "x"
    await run_log.save("0123456789abcdef", log)
    assert await run_log.load("0123456789abcdef") == log


async def test_upload_store_keeps_description_and_bytes(uploads: UploadStore) -> None:
    assert await uploads.get("f_0123456789abcdef") is None
    content = bytes(range(256)) * 3 + b"\x00end"  # every byte value, NUL included
    kept = StoredUpload(
        id="f_0123456789abcdef",
        name="résumé.bin",
        type="file",
        mime_type="application/octet-stream",
        size_bytes=len(content),
        sha256="ab" * 32,
        chat_id="c1",
        owner={"tenant": "acme", "subject": "ada"},
    )
    anonymous = StoredUpload(
        id="f_fedcba9876543210",
        name="a.png",
        type="image",
        mime_type="image/png",
        size_bytes=0,
        sha256="cd" * 32,
        chat_id="",
    )
    await uploads.put(kept, content)
    await uploads.put(anonymous, b"")
    assert await uploads.get(kept.id) == (kept, content)
    assert await uploads.get(anonymous.id) == (anonymous, b"")
    assert await uploads.get("f_0000000000000000") is None


async def test_uploads_through_the_port_are_found_by_their_owner_only(
    uploads: UploadStore,
) -> None:
    service = Uploads(uploads, max_bytes=1024)
    ada = Principal("acme", "ada")
    png = b"\x89PNG\r\n\x1a\n" + b"\x01" * 8
    saved = await service.save("pic", png, "text/plain", "", owner=ada)
    assert (saved.type, saved.mime_type, saved.size_bytes) == ("image", "image/png", 16)
    assert await service.get(saved.id, ada) == (saved, png)
    for other in (ANONYMOUS, Principal("acme", "bob")):
        with pytest.raises(NotFound):
            await service.get(saved.id, other)
    mine = await service.save("notes.txt", b"hello", "", "")
    assert await service.get(mine.id) == (mine, b"hello")


# -- chat lifecycle: renamed, searched, expired, deleted ---------------------------------


def rename(chat_id: str, name: str, ts: int) -> dict:
    return {"_type": "update", "chatId": chat_id, "updatedAt": ts, "chatName": name}


async def test_a_renamed_chat_is_listed_and_searched_by_its_new_name(chats: ChatStore) -> None:
    ada = Principal("acme", "ada")
    for n, message in enumerate(["Weather in Paris", "Trip to Rome", "Paris again"]):
        record = query(f"c{n}", "r1", message, 100 + n) | {"owner": ada.to_record()}
        await chats.append(f"c{n}", [record])
    await chats.append("c1", [rename("c1", "Holidays: PARIS and Rome", 200)])
    summary = await chats.summary("c1")
    assert summary is not None
    assert (summary.chat_name, summary.run_count, summary.updated_at) == (
        "Holidays: PARIS and Rome",
        1,
        200,
    )
    assert [r["_type"] for r in await chats.read("c1")] == ["query", "update"]
    page, cursor = await chats.page(10, owner=ada, name_contains="paris")
    assert [s.chat_id for s in page] == ["c1", "c2", "c0"] and cursor == ""
    page, cursor = await chats.page(1, owner=ada, name_contains="Paris")
    assert [s.chat_id for s in page] == ["c1"] and cursor
    page, cursor = await chats.page(1, cursor, owner=ada, name_contains="Paris")
    assert [s.chat_id for s in page] == ["c2"] and cursor
    assert (await chats.page(10, owner=ada, name_contains="rome"))[0][0].chat_id == "c1"
    assert (await chats.page(10, owner=ada, name_contains="london")) == ([], "")
    assert (await chats.page(10, name_contains="paris")) == ([], "")  # another owner's


async def test_expired_chats_are_found_oldest_first_whoever_owns_them(chats: ChatStore) -> None:
    for n, owner in enumerate([ANONYMOUS, Principal("acme", "ada"), ANONYMOUS]):
        record = query(f"c{n}", "r1", "hi", 100 * (n + 1)) | {"owner": owner.to_record()}
        await chats.append(f"c{n}", [record])
    await chats.append("c0", [step("c0", "r1", 1, 250)])  # changed later than c1
    assert [s.chat_id for s in await chats.expired(300, 10)] == ["c1", "c0"]
    assert [s.chat_id for s in await chats.expired(300, 1)] == ["c1"]
    assert await chats.expired(100, 10) == []


async def test_a_deleted_chat_is_gone_and_its_id_can_start_afresh(chats: ChatStore) -> None:
    await chats.append("c0", [query("c0", "r1", "first", 1), step("c0", "r1", 1, 2)])
    await chats.append("c1", [query("c1", "r1", "other", 3)])
    assert await chats.delete("c0") is True
    assert await chats.delete("c0") is False
    assert await chats.summary("c0") is None
    with pytest.raises(ChatNotFound):
        await chats.read("c0")
    assert [s.chat_id for s in (await chats.page(10))[0]] == ["c1"]
    await chats.append("c0", [query("c0", "r2", "anew", 5)])
    assert [r["runId"] for r in await chats.read("c0")] == ["r2"]
    summary = await chats.summary("c0")
    assert summary is not None and (summary.chat_name, summary.run_count) == ("anew", 1)


async def test_run_logs_are_deleted_by_run(run_log: RunLog) -> None:
    ids = ["0123456789abcdef", "fedcba9876543210"]
    for run_id in ids:
        event = events.run_complete("stop")
        event.seq, event.run_id, event.type = 1, run_id, "run.complete"
        await run_log.save(run_id, [event])
    assert await run_log.delete([ids[0], "never-kept", "../bad"]) == 1
    assert await run_log.load(ids[0]) is None
    assert await run_log.load(ids[1]) is not None
    assert await run_log.delete([]) == 0


async def test_the_uploads_of_a_chat_are_deleted_with_it(uploads: UploadStore) -> None:
    def upload(upload_id: str, chat_id: str) -> StoredUpload:
        return StoredUpload(upload_id, "a.txt", "file", "text/plain", 1, "ab" * 32, chat_id)

    kept = [upload("f_000000000000000" + str(n), chat) for n, chat in enumerate("aab")]
    for item in kept:
        await uploads.put(item, b"x")
    assert await uploads.delete_chat("a") == 2
    assert [await uploads.get(u.id) is None for u in kept] == [True, True, False]
    assert await uploads.delete_chat("a") == 0
