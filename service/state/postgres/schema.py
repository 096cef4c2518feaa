"""PostgreSQL plumbing of the state backends: the connection pool, the schema, failures.

The schema is the SQL files of `migrations/` beside this module, named `NNNN_name.sql`
and applied in order, each once. `migrate()` runs in one transaction under a
transaction-scoped advisory lock, so replicas that start at once apply them one
after the other: the first applies what is missing and records each version in
`schema_migrations`, the others then find nothing to do. Every pool is migrated
before it is handed out (`open_pool`).

Database failures (the server gone, a connection cut, a statement refused) reach
the core as `StoreFailed`, never as a driver exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import asyncpg

from service.core.errors import StoreFailed

log = logging.getLogger("agw.store")

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
#: How long one call may take, connecting included (`AGW_POSTGRES_TIMEOUT_S`).
DEFAULT_TIMEOUT_S = 10.0
#: The advisory lock taken while migrating ("agw" in ASCII).
MIGRATION_LOCK = 0x616777
_NAME = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql\Z")

Pool = Any  # asyncpg.Pool (asyncpg ships no type information)
Connection = Any  # asyncpg.Connection


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migrations shipped in `directory`, by version."""
    found: list[Migration] = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match is None:
            continue
        found.append(Migration(int(match[1]), match[2], path.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ValueError(f"two migrations share a version in {directory}: {versions}")
    return found


async def migrate(connection: Connection, shipped: list[Migration] | None = None) -> list[int]:
    """Apply the shipped migrations the database lacks; the versions applied now."""
    shipped = migrations() if shipped is None else shipped
    applied_now: list[int] = []
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        await connection.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY,"
            " name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        rows = await connection.fetch("SELECT version FROM schema_migrations")
        applied = {int(row["version"]) for row in rows}
        for migration in shipped:
            if migration.version in applied:
                continue
            await connection.execute(migration.sql)
            await connection.execute(
                "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                migration.version,
                migration.name,
            )
            applied_now.append(migration.version)
    newer = applied - {m.version for m in shipped}
    if newer:
        log.warning("the database has migrations this version does not know: %s", sorted(newer))
    if applied_now:
        log.info("applied database migrations %s", applied_now)
    return applied_now


async def open_pool(
    dsn: str,
    *,
    max_size: int = 10,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    setting: str = "AGW_POSTGRES_DSN",
) -> Pool:
    """A connection pool on `dsn`, with the schema migrated.

    `timeout_s` bounds connecting and every statement (a call as a whole is bounded by
    `PooledStore.connection`): a database that stops answering (a frozen server, a cut
    network) fails the call with `StoreFailed`, never hangs it.
    """
    if not dsn:
        raise StoreFailed(f"no PostgreSQL database to connect to: set {setting}")
    with failures("could not open the PostgreSQL database"):
        pool = await asyncpg.create_pool(
            dsn,
            min_size=1,
            max_size=max_size,
            timeout=timeout_s,
            command_timeout=timeout_s,
            reset=_nothing_to_reset,
        )
    try:
        with failures("could not migrate the PostgreSQL database"):
            async with pool.acquire() as connection:
                await migrate(connection)
    except BaseException:
        pool.terminate()
        raise
    return pool


async def _nothing_to_reset(connection: Connection) -> None:
    """A connection goes back to the pool without the reset query's round trip (asyncpg's
    default: unlock advisory locks, close cursors, unlisten, reset settings): the stores
    leave no session state behind — their advisory locks are transaction-scoped, they
    declare no cursor and change no setting, and the agent store listens on a connection
    of its own. (A transaction left open is still rolled back, by the pool.)"""


async def close_pool(pool: Pool | None, timeout_s: float = 10.0) -> None:
    """Close the pool once its connections are back; cut them after `timeout_s`."""
    if pool is None:
        return
    try:
        await asyncio.wait_for(pool.close(), timeout_s)
    except TimeoutError:
        log.warning("PostgreSQL connections still busy after %.0fs: cut", timeout_s)
        pool.terminate()


class PooledStore:
    """A store on its own connection pool of the database at `dsn`, opened (and the
    schema migrated) by `open`, returned by `close`.

    Each call takes its connection with `connection`, under one deadline: taking the
    connection (connecting, when the pool has none free) and every statement on it
    together take at most `timeout_s`. The pool's own time-outs (connecting, each
    statement) would stack, and so would asyncpg's wait, after a statement it gave up
    on, for the server to confirm the cancel: a frozen server made a call fail after
    twice the time-out. A call cut short closes its connection at once instead (the
    server rolls back what it had begun), and the next call connects anew.

    A call made on every turn of the event loop (the run journal's events) takes the
    store's kept connection instead (`kept_connection`): taken from the pool once and
    kept between calls, under the same deadline and failure handling.
    """

    #: What the store is, for the error of using it before `open`.
    what: ClassVar[str] = "PostgreSQL store"

    def __init__(self, dsn: str, *, pool_size: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.dsn = dsn
        self.pool_size = pool_size
        self.timeout_s = timeout_s
        self._pool: Pool | None = None
        self._kept: Connection | None = None  # `kept_connection`'s, between its calls
        self._kept_busy = False  # a call holds it

    @property
    def pool(self) -> Pool:
        if self._pool is None:
            raise RuntimeError(f"the {self.what} is not open")
        return self._pool

    async def open(self) -> None:
        self._pool = await open_pool(self.dsn, max_size=self.pool_size, timeout_s=self.timeout_s)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        kept = self._kept
        if kept is not None and not self._kept_busy:  # (a call under way gives it back)
            self._kept = None
            await _give_back(pool, kept, self.timeout_s)
        await close_pool(pool)

    @contextlib.asynccontextmanager
    async def connection(self, what: str) -> AsyncIterator[Connection]:
        """A connection of the pool for one call, which must end within `timeout_s` from
        now; a database failure or the deadline is `StoreFailed` ("{what}: …")."""
        pool = self.pool
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        with failures(what):
            async with asyncio.timeout_at(deadline):
                connection = await pool.acquire()
                try:
                    yield connection
                except BaseException:
                    connection.terminate()  # failed or cut short: not to be trusted or waited for
                    raise
        left = deadline - loop.time()
        if left <= 0:
            connection.terminate()  # no time left to reset it for the next call
            return
        try:  # reset for the next call within the time left; a reset that fails closes it
            await pool.release(connection, timeout=left)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as error:
            log.warning("a PostgreSQL connection could not be reset, closed (%s)", error)

    @contextlib.asynccontextmanager
    async def kept_connection(self, what: str) -> AsyncIterator[Connection]:
        """`connection` for a call made on every turn of the event loop: the store's kept
        connection, taken from the pool by its first call and kept, so that each call
        skips the pool's acquire and release (the release is a task of its own). The
        same deadline (taking the connection, when it has none, and the statements
        together) and the same failures: a call cut short or failed closes it, and the
        next call takes another. A call made while another one holds it takes one from
        the pool (`connection`)."""
        if self._kept_busy:
            async with self.connection(what) as connection:
                yield connection
            return
        pool = self.pool
        self._kept_busy = True
        try:
            with failures(what):
                async with asyncio.timeout(self.timeout_s):
                    connection = self._kept
                    if connection is None or not _open(connection):
                        self._kept = None
                        connection = await pool.acquire()
                        self._kept = connection
                    try:
                        yield connection
                    except BaseException:
                        self._kept = None
                        with contextlib.suppress(asyncpg.InterfaceError):  # (gone already)
                            connection.terminate()  # failed or cut short: not to be trusted
                        raise
        finally:
            self._kept_busy = False
        if self._pool is not pool and self._kept is connection:  # closed meanwhile
            self._kept = None
            await _give_back(pool, connection, self.timeout_s)


def _open(connection: Connection) -> bool:
    """Whether a kept connection is still open (one that closed went back to its pool)."""
    try:
        return not connection.is_closed()
    except asyncpg.InterfaceError:  # released to its pool when it closed
        return False


async def _give_back(pool: Pool, connection: Connection, timeout_s: float) -> None:
    """Release a kept connection to its pool (closed instead when that fails)."""
    try:
        await pool.release(connection, timeout=timeout_s)
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as error:
        log.warning("a PostgreSQL connection could not be reset, closed (%s)", error)
        connection.terminate()


@contextlib.contextmanager
def failures(what: str) -> Iterator[None]:
    """Report a database failure inside the block as `StoreFailed` ("{what}: {error}")."""
    try:
        yield
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as error:
        why = "no answer in time" if isinstance(error, TimeoutError) else str(error)
        raise StoreFailed(f"{what}: {type(error).__name__}: {why}") from error
