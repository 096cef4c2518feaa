"""Pytest fixtures of the throwaway servers (`service.testing.servers`).

One PostgreSQL and one Redis per test session, started on first use; each test
gets its own empty database (`postgres_dsn`) and an emptied Redis (`redis_url`).
Missing binaries fail the test with a message naming `make install`, never skip.
Imported by tests/conftest.py, so every test directory can ask for them.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from service.testing import PostgresServer, RedisServer, ServerUnavailable

_databases = itertools.count(1)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    try:
        server = PostgresServer.start()
    except ServerUnavailable as error:
        pytest.fail(f"no PostgreSQL for the tests: {error}", pytrace=False)
    with server:
        yield server


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    """The DSN of a new, empty database, dropped after the test."""
    name = f"agw_test_{os.getpid()}_{next(_databases)}"
    dsn = postgres_server.create_database(name)
    yield dsn
    postgres_server.drop_database(name)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    try:
        server = RedisServer.start()
    except ServerUnavailable as error:
        pytest.fail(f"no Redis for the tests: {error}", pytrace=False)
    with server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The URL of the session's Redis, emptied for this test."""
    redis_server.flush()
    return redis_server.url
