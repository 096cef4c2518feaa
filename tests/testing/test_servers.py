"""The throwaway servers of the tests: real, loopback only, nothing kept, and removed."""

from __future__ import annotations

import os
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

from service.testing import (
    PostgresServer,
    RedisServer,
    ServerUnavailable,
    postgres_bindir,
    redis_binary,
)


def test_missing_binaries_name_make_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServerUnavailable, match=r"run `make install` \(Debian package postgresql"):
        postgres_bindir(lib=tmp_path)
    with pytest.raises(
        ServerUnavailable, match=r"run `make install` \(Debian package redis-server"
    ):
        redis_binary()


async def test_postgres_keeps_nothing_durable_and_listens_on_loopback_only(
    postgres_server: PostgresServer, postgres_dsn: str
) -> None:
    connection = await asyncpg.connect(postgres_dsn)
    try:
        settings = await connection.fetch(
            "SELECT name, setting FROM pg_settings WHERE name = ANY($1::text[]) ORDER BY name",
            ["fsync", "listen_addresses", "server_encoding", "unix_socket_directories"],
        )
        assert [tuple(row) for row in settings] == [
            ("fsync", "off"),
            ("listen_addresses", "127.0.0.1"),
            ("server_encoding", "UTF8"),
            ("unix_socket_directories", str(postgres_server.directory)),
        ]
    finally:
        await connection.close()
    data = postgres_server.directory / "data"
    if os.geteuid() == 0:  # PostgreSQL refuses root: the cluster belongs to `postgres`
        assert data.stat().st_uid != 0
    assert postgres_server.dsn().startswith("postgresql://postgres@127.0.0.1:")


async def test_each_test_gets_an_empty_database(postgres_dsn: str) -> None:
    connection = await asyncpg.connect(postgres_dsn)
    try:
        assert (
            await connection.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
            == 0
        )
        await connection.execute("CREATE TABLE left_behind (x int)")
    finally:
        await connection.close()


async def test_the_next_test_does_not_see_the_last_ones_tables(postgres_dsn: str) -> None:
    connection = await asyncpg.connect(postgres_dsn)
    try:
        assert await connection.fetchval("SELECT to_regclass('left_behind')") is None
    finally:
        await connection.close()


async def test_redis_is_emptied_per_test_and_persists_nothing(redis_url: str) -> None:
    client = aioredis.from_url(redis_url)
    try:
        assert await client.dbsize() == 0
        await client.set("k", "v")
        assert await client.get("k") == b"v"
        config = await client.config_get("*")
        assert (config["save"], config["appendonly"], config["bind"]) == ("", "no", "127.0.0.1")
    finally:
        await client.aclose()


def test_stopping_a_server_ends_it_and_removes_its_directory() -> None:
    for start in (PostgresServer.start, RedisServer.start):
        server = start()
        process, directory = server.process, server.directory
        assert process is not None and process.poll() is None and directory.is_dir()
        server.stop()
        assert process.poll() is not None and not directory.exists()
