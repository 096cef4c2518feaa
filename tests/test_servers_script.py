"""`scripts/servers.py`: throwaway PostgreSQL and Redis for trying the shared state by hand.

The script runs as a user runs it; its printed line is used as docs/scale-out.md says (the
DSN and URL are connected to), then SIGINT stops both servers and removes their data.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parents[1]


async def test_servers_script_serves_until_interrupted() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "gen")])}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "scripts" / "servers.py"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        words = shlex.split(line)
        assert words[0] == "export", line
        settings = dict(word.split("=", 1) for word in words[1:])
        assert sorted(settings) == ["AGW_POSTGRES_DSN", "AGW_REDIS_URL"]
        assert settings["AGW_POSTGRES_DSN"].endswith("/agw")

        connection = await asyncpg.connect(settings["AGW_POSTGRES_DSN"])
        try:
            assert await connection.fetchval("SELECT current_database()") == "agw"
        finally:
            await connection.close()
        client = aioredis.from_url(settings["AGW_REDIS_URL"])
        try:
            assert await client.ping() is True
        finally:
            await client.aclose()
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(process.wait(), 30)
    errors = (await process.stderr.read()).decode()
    assert code == 0, errors
    assert errors.splitlines() == [
        "PostgreSQL and Redis are up; Ctrl-C stops them",
        "PostgreSQL and Redis stopped, their data removed",
    ]
    client = aioredis.from_url(settings["AGW_REDIS_URL"])  # both servers are gone
    try:
        with pytest.raises(aioredis.ConnectionError):
            await client.ping()
    finally:
        await client.aclose()
    with pytest.raises(OSError):
        await asyncpg.connect(settings["AGW_POSTGRES_DSN"], timeout=5)
