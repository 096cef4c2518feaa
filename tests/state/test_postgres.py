"""The PostgreSQL chat store and run log against a real server: what the port checks don't.

Schema migrations (idempotent, concurrent, all-or-nothing), records read back
exactly, large records, ownership filtered in SQL, a connection killed in the
middle of an append, a writer process killed with SIGKILL, appends from two
stores (two replicas) to one chat, expiry of run logs, and failures reported as
`StoreFailed`.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator

import asyncpg
import pytest

from service.core import events
from service.core.errors import ChatNotFound, StoreFailed
from service.core.ids import ANONYMOUS, Principal
from service.core.run.journal import JournalEntry, entries_of
from service.state.postgres.chats import PostgresChatStore
from service.state.postgres.journal import PostgresRunJournal
from service.state.postgres.run_log import PostgresRunLog
from service.state.postgres.schema import Migration, migrate, migrations, open_pool
from service.state.postgres.uploads import PostgresUploadStore
from service.state.postgres.webhooks import PostgresWebhookStore
from service.testing import PostgresServer
from tests.state.test_ports import query, step


@pytest.fixture
async def store(postgres_dsn: str) -> AsyncIterator[PostgresChatStore]:
    chats = PostgresChatStore(postgres_dsn)
    await chats.open()
    yield chats
    await chats.close()


async def tables(dsn: str) -> list[str]:
    connection = await asyncpg.connect(dsn)
    try:
        rows = await connection.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
        )
        return [row["tablename"] for row in rows]
    finally:
        await connection.close()


# -- migrations ------------------------------------------------------------------------

#: The versions of the migrations shipped, in order.
SHIPPED = [1, 2, 3, 10, 11, 12, 13, 14]


async def test_migrations_apply_once_however_often_the_stores_open(postgres_dsn: str) -> None:
    assert [m.version for m in migrations()] == SHIPPED
    connection = await asyncpg.connect(postgres_dsn)
    try:
        assert await migrate(connection) == SHIPPED
        assert await migrate(connection) == []
    finally:
        await connection.close()
    for backend in (
        PostgresChatStore(postgres_dsn),
        PostgresRunLog(postgres_dsn, 60.0),
        PostgresUploadStore(postgres_dsn),
        PostgresWebhookStore(postgres_dsn),
    ):
        await backend.open()
        await backend.close()
    assert await tables(postgres_dsn) == [
        "agent_versions",
        "chat_records",
        "chats",
        "journal_events",
        "journal_runs",
        "journal_steps",
        "run_logs",
        "schema_migrations",
        "spend_ledger",
        "uploads",
        "webhook_deliveries",
        "webhooks",
    ]


async def test_replicas_starting_at_once_apply_the_migrations_exactly_once(
    postgres_dsn: str,
) -> None:
    connections = [await asyncpg.connect(postgres_dsn) for _ in range(6)]
    try:
        applied = await asyncio.gather(*(migrate(c) for c in connections))
        assert sorted(applied) == [[], [], [], [], [], SHIPPED]
        rows = await connections[0].fetch(
            "SELECT version, name FROM schema_migrations ORDER BY version"
        )
        assert [tuple(row) for row in rows] == [
            (1, "initial"),
            (2, "uploads"),
            (3, "drop_run_registry"),
            (10, "chat_lifecycle"),
            (11, "spend_ledger"),
            (12, "agent_store"),
            (13, "run_journal"),
            (14, "webhooks"),
        ]
    finally:
        for connection in connections:
            await connection.close()


async def test_a_database_of_an_earlier_version_loses_the_unused_run_registry(
    postgres_dsn: str,
) -> None:
    connection = await asyncpg.connect(postgres_dsn)
    try:
        assert await migrate(connection, migrations()[:2]) == [1, 2]
        assert {"runs", "mailbox"} <= set(await tables(postgres_dsn))
        assert await migrate(connection) == SHIPPED[2:]
        sequences = await connection.fetch("SELECT relname FROM pg_class WHERE relkind = 'S'")
        assert "run_fences" not in {row["relname"] for row in sequences}
    finally:
        await connection.close()
    assert not {"runs", "mailbox"} & set(await tables(postgres_dsn))


async def test_a_new_migration_applies_on_top_and_a_broken_one_leaves_nothing(
    postgres_dsn: str,
) -> None:
    connection = await asyncpg.connect(postgres_dsn)
    try:
        await migrate(connection)
        later = Migration(100, "notes", "CREATE TABLE notes (chat_id text, note text)")
        assert await migrate(connection, [*migrations(), later]) == [100]
        broken = Migration(101, "broken", "CREATE TABLE half (x int); SELECT no_such_column;")
        with pytest.raises(asyncpg.UndefinedColumnError):
            await migrate(connection, [*migrations(), later, broken])
        versions = await connection.fetch("SELECT version FROM schema_migrations ORDER BY 1")
        assert [row["version"] for row in versions] == [*SHIPPED, 100]
    finally:
        await connection.close()
    assert "half" not in await tables(postgres_dsn)
    assert "notes" in await tables(postgres_dsn)


async def test_an_unreachable_or_missing_database_is_a_store_failure(
    postgres_dsn: str, postgres_server: PostgresServer
) -> None:
    with pytest.raises(StoreFailed, match="set AGW_POSTGRES_DSN"):
        await PostgresChatStore("").open()
    with pytest.raises(StoreFailed, match="could not open the PostgreSQL database"):
        await PostgresRunLog(postgres_server.dsn("no_such_database"), 60.0).open()


# -- records ---------------------------------------------------------------------------


async def test_records_read_back_exactly_as_appended(store: PostgresChatStore) -> None:
    odd = {
        "_type": "step",
        "zeta": 1,
        "alpha": [1.5, 1e300, -0.0, 12345678901234567890, None, True],
        "text": 'nul \u0000, emoji 🙂, quote ", backslash \\, line\nbreak',
        "nested": {"b": {"y": 2, "x": 1}, "a": []},
        "updatedAt": 5,
    }
    await store.append("c", [query("c", "r", "hi", 1), odd])
    second = (await store.read("c"))[1]
    assert second == odd
    assert list(second) == list(odd) and list(second["nested"]["b"]) == ["y", "x"]
    assert json.dumps(second) == json.dumps(odd)


async def test_large_records_are_kept_whole(store: PostgresChatStore) -> None:
    big = step("c", "r", 1, 2)
    big["messages"][0]["content"][0]["text"] = "x" * (8 * 1024 * 1024)
    many = [step("c", "r", n, 3) for n in range(2, 2002)]
    await store.append("c", [query("c", "r", "big", 1), big])
    await store.append("c", many)
    records = await store.read("c")
    assert len(records) == 2002
    assert records[1] == big
    assert [r["_seq"] for r in records[2:]] == list(range(2, 2002))


async def test_appends_of_one_store_keep_their_call_order(store: PostgresChatStore) -> None:
    await store.append("c", [query("c", "r", "go", 1)])
    # Started together, as the recorder does: each takes the chat's lock before any await.
    await asyncio.gather(*(store.append("c", [step("c", "r", n, n)]) for n in range(1, 51)))
    assert [r.get("_seq") for r in (await store.read("c"))[1:]] == list(range(1, 51))


async def test_two_replicas_appending_to_one_chat_lose_nothing(postgres_dsn: str) -> None:
    replicas = [PostgresChatStore(postgres_dsn), PostgresChatStore(postgres_dsn)]
    for replica in replicas:
        await replica.open()
    try:
        await replicas[0].append("c", [query("c", "r", "go", 1)])

        async def writer(replica: PostgresChatStore, name: str) -> None:
            for n in range(40):
                await replica.append("c", [step("c", name, n, 10), step("c", name, n, 11)])

        await asyncio.gather(writer(replicas[0], "a"), writer(replicas[1], "b"))
        records = await replicas[1].read("c")
        assert len(records) == 161
        for name in ("a", "b"):  # each replica's records in its order, pairs never split
            mine = [(i, r["_seq"]) for i, r in enumerate(records) if r["runId"] == name]
            assert [seq for _, seq in mine] == [n for n in range(40) for _ in (0, 1)]
            assert all(mine[k + 1][0] == mine[k][0] + 1 for k in range(0, 80, 2))
        summary = await replicas[0].summary("c")
        assert summary is not None and (summary.run_count, summary.updated_at) == (1, 11)
    finally:
        for replica in replicas:
            await replica.close()


# -- ownership and paging --------------------------------------------------------------


async def test_pages_hold_only_the_owners_chats(store: PostgresChatStore) -> None:
    ada, bob = Principal("acme", "ada"), Principal("acme", "bob")
    other_tenant = Principal("other", "ada")
    for n, owner in enumerate([ada, bob, ada, ANONYMOUS, other_tenant, ada, bob]):
        record = query(f"c{n}", "r", f"chat {n}", 100 + n)
        if not owner.anonymous:
            record["owner"] = owner.to_record()
        await store.append(f"c{n}", [record])

    async def every_page(owner: Principal) -> list[str]:
        seen: list[str] = []
        cursor = ""
        while True:
            page, cursor = await store.page(2, cursor, owner=owner)
            assert all(s.owner == owner for s in page)
            seen += [s.chat_id for s in page]
            if not cursor:
                return seen

    assert await every_page(ada) == ["c5", "c2", "c0"]
    assert await every_page(bob) == ["c6", "c1"]
    assert await every_page(other_tenant) == ["c4"]
    assert await every_page(ANONYMOUS) == ["c3"]
    assert await every_page(Principal("acme", "eve")) == []
    summary = await store.summary("c5")
    assert summary is not None and summary.owner == ada


async def test_paging_neither_repeats_nor_skips_a_chat_updated_meanwhile(
    store: PostgresChatStore,
) -> None:
    for n in range(5):
        await store.append(f"c{n}", [query(f"c{n}", "r", f"chat {n}", 100 + n)])
    page, cursor = await store.page(2)
    assert [s.chat_id for s in page] == ["c4", "c3"]
    await store.append("c0", [step("c0", "r", 1, 500)])  # c0 moves to the top
    page, cursor = await store.page(2, cursor)
    assert [s.chat_id for s in page] == ["c2", "c1"] and cursor == ""
    page, cursor = await store.page(2, "not a cursor")
    assert [s.chat_id for s in page] == ["c0", "c4"]


# -- crash safety ----------------------------------------------------------------------


async def test_a_connection_killed_in_the_middle_of_an_append_leaves_no_partial_record(
    store: PostgresChatStore, postgres_dsn: str
) -> None:
    await store.append("c", [query("c", "r", "go", 1)])
    blocker = await asyncpg.connect(postgres_dsn)
    admin = await asyncpg.connect(postgres_dsn)
    try:
        # An uncommitted row at position 1 makes the append wait after it updated the chat.
        blocked = blocker.transaction()
        await blocked.start()
        await blocker.execute(
            "INSERT INTO chat_records (chat_id, position, record) VALUES ('c', 1, '{}')"
        )
        append = asyncio.create_task(
            store.append("c", [step("c", "r", 1, 2), step("c", "r", 2, 3)])
        )
        for _ in range(500):
            pid = await admin.fetchval(
                "SELECT pid FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND query LIKE '%INSERT INTO chat_records%'"
            )
            if pid is not None:
                break
            await asyncio.sleep(0.01)
        assert pid is not None
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        with pytest.raises(StoreFailed, match="could not append to chat 'c'"):
            await append
        await blocked.rollback()
    finally:
        await blocker.close()
        await admin.close()
    assert [r["_type"] for r in await store.read("c")] == ["query"]
    await store.append("c", [step("c", "r", 1, 4)])  # the pool replaced the killed connection
    assert [r.get("_seq") for r in await store.read("c")] == [None, 1]
    summary = await store.summary("c")
    assert summary is not None and summary.updated_at == 4


WRITER = """
import asyncio, sys
from service.state.postgres.chats import PostgresChatStore

async def main():
    store = PostgresChatStore(sys.argv[1])
    await store.open()

    async def writer(chat_id):
        n = 0
        while True:
            n += 1
            batch = [{"_type": "step", "batch": n, "part": p, "pad": "x" * 20000} for p in range(5)]
            await store.append(chat_id, batch)
            if n == 3 and chat_id == "w0":
                print("ready", flush=True)

    await asyncio.gather(*(writer(f"w{k}") for k in range(4)))

asyncio.run(main())
"""


@pytest.mark.parametrize("trial", range(3))
async def test_a_writer_killed_with_sigkill_leaves_only_whole_appends(
    store: PostgresChatStore, postgres_dsn: str, trial: int
) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WRITER, postgres_dsn, stdout=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    assert await asyncio.wait_for(process.stdout.readline(), 20) == b"ready\n"
    await asyncio.sleep(0.05 + 0.1 * trial)
    process.send_signal(signal.SIGKILL)
    await process.wait()

    # The server may still commit a transaction the killed client had sent: wait until the
    # chats stop changing before looking at them.
    async def records_of(chat_id: str) -> list[dict[str, object]]:
        try:
            return await store.read(chat_id)
        except ChatNotFound:  # killed before its first append landed
            return []

    seen: list[int] = []
    for _ in range(50):
        counts = [len(await records_of(f"w{k}")) for k in range(4)]
        if counts == seen:
            break
        seen = counts
        await asyncio.sleep(0.1)
    for chat_id in ("w0", "w1", "w2", "w3"):
        records = await records_of(chat_id)
        batches = [r["batch"] for r in records]
        last = batches[-1] if batches else 0
        assert batches == [n for n in range(1, last + 1) for _ in range(5)]
        assert [r["part"] for r in records] == list(range(5)) * last
        await store.append(chat_id, [step(chat_id, "after", 1, 2)])
        assert len(await store.read(chat_id)) == len(records) + 1


# -- run logs --------------------------------------------------------------------------


def ended_run(run_id: str) -> list:
    log = [events.run_start("a"), events.run_complete("stop")]
    for seq, event in enumerate(log, 1):
        event.seq, event.run_id, event.chat_id, event.type = seq, run_id, "c", "x"
    return log


async def test_run_logs_expire_and_are_pruned(postgres_dsn: str) -> None:
    short = PostgresRunLog(postgres_dsn, 0.3)
    await short.open()
    try:
        await short.save("0123456789abcdef", ended_run("0123456789abcdef"))
        assert await short.load("0123456789abcdef") == ended_run("0123456789abcdef")
        assert await short.load("../etc/passwd") is None
        await asyncio.sleep(0.4)
        assert await short.load("0123456789abcdef") is None  # expired: never read
        assert await short.prune() == 1
    finally:
        await short.close()
    kept = PostgresRunLog(postgres_dsn, 3600.0)
    await kept.open()
    try:
        await kept.save("fedcba9876543210", ended_run("fedcba9876543210"))
        await kept.save("fedcba9876543210", ended_run("fedcba9876543210")[:1])  # saved again
        assert await kept.load("fedcba9876543210") == ended_run("fedcba9876543210")[:1]
        assert await kept.prune() == 0
    finally:
        await kept.close()


async def test_a_pool_is_migrated_before_it_is_handed_out(postgres_dsn: str) -> None:
    pool = await open_pool(postgres_dsn, max_size=2)
    try:
        assert await pool.fetchval("SELECT count(*) FROM schema_migrations") == len(migrations())
    finally:
        await pool.close()


async def test_reading_a_missing_chat_is_not_found(store: PostgresChatStore) -> None:
    with pytest.raises(ChatNotFound):
        await store.read("nothing-here")
    await store.append("c", [])
    assert await store.summary("c") is None


async def test_the_journals_events_go_on_a_kept_connection_taken_anew_once_cut(
    postgres_dsn: str,
) -> None:
    journal = PostgresRunJournal(postgres_dsn, pool_size=2)
    await journal.open()
    admin = await asyncpg.connect(postgres_dsn)
    run = "0123456789abcdef"
    logged = [events.run_start("a"), *(events.content_delta("c_1", f"{n}") for n in range(5))]
    for seq, event in enumerate(logged, 1):
        event.seq, event.run_id, event.chat_id, event.type = seq, run, "c", "x"

    async def writers() -> list[int]:
        return [
            row["pid"]
            for row in await admin.fetch(
                "SELECT pid FROM pg_stat_activity"
                " WHERE query LIKE 'INSERT INTO journal_events%' AND pid <> pg_backend_pid()"
            )
        ]

    try:
        await journal.write([JournalEntry(run, "begin", "c", b"{}")])
        for event in logged[:3]:  # one batch after the other: one connection writes them all
            await journal.write(entries_of(run, [event]))
        (kept,) = await writers()
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", kept)
        await asyncio.sleep(0.2)  # the client sees its connection closed
        for event in logged[3:]:
            await journal.write(entries_of(run, [event]))
        assert kept not in await writers()
        loaded = await journal.load(run)
        assert loaded is not None and loaded.events == logged
    finally:
        await admin.close()
        async with asyncio.timeout(5):  # the kept connection goes back: the pool closes at once
            await journal.close()
