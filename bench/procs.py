"""Starting and stopping the benchmarked processes (`python -m bench.serve KIND`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.control import ControlClient
from service.testing import PostgresServer, RedisServer

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


@dataclass
class Child:
    """A running child process and its control connection."""

    kind: str
    process: asyncio.subprocess.Process
    port: int
    pid: int
    control: ControlClient

    async def stats(self) -> dict[str, Any]:
        return await self.control.stats()

    async def flush(self) -> dict[str, Any]:
        """Have it export what it buffers (telemetry), then its stats."""
        return await self.control.stats("flush")

    async def kill(self) -> None:
        """Kill it (SIGKILL: a crash, nothing flushed) and release its pipes and connection."""
        with contextlib.suppress(ProcessLookupError):  # already gone
            self.process.kill()
        await self.process.communicate()
        with contextlib.suppress(OSError):
            await self.control.aclose()

    async def stop(self) -> None:
        """Close its stdin (it stops cleanly), wait for it; kill it if it hangs."""
        await self.control.aclose()
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.communicate(), STOP_TIMEOUT_S)
        except TimeoutError:
            self.process.kill()
            await self.process.communicate()
        if self.process.returncode not in (0, None):
            print(f"bench: {self.kind} exited with {self.process.returncode}", file=sys.stderr)


async def spawn(kind: str, *args: str, env: dict[str, str] | None = None) -> Child:
    """Start `python -m bench.serve KIND ARGS...` and wait until it is ready; `env` is added
    to this process's environment (e.g. `AGW_` settings)."""
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.serve",
        kind,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env=env,
    )
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), READY_TIMEOUT_S)
        if not line.startswith(b"READY "):
            raise RuntimeError(f"bench: {kind} did not start (exit code {process.returncode})")
        info = json.loads(line[6:])
        control = await ControlClient.connect(int(info["control"]))
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.communicate()
        raise
    return Child(kind, process, int(info["port"]), int(info["pid"]), control)


def tree_rss_bytes(pid: int) -> int:
    """The resident memory of `pid` and every live descendant, from `/proc` (VmRSS)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, p in parents.items() if p == parent and child not in tree]
        tree.update(children)
        frontier += children
    total = 0
    for member in tree:
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def tree_cpu_ns(pid: int) -> int:
    """User + system CPU of `pid` and every live descendant, from `/proc` (clock ticks)."""
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) * _TICK_NS
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, p in parents.items() if p == parent and child not in tree]
        tree.update(children)
        frontier += children
    return sum(times.get(member, 0) for member in tree)


def replica_env(postgres: PostgresServer, redis: RedisServer, database: str) -> dict[str, str]:
    """The settings of gateway replicas sharing `database` (created on `postgres`) and the
    Redis run bus on `redis`: chats and run logs in PostgreSQL (each adds its own
    `AGW_REPLICA_ID`)."""
    return {
        "AGW_CHAT_STORE": "postgres",
        "AGW_RUN_LOG": "postgres",
        "AGW_POSTGRES_DSN": postgres.create_database(database),
        "AGW_RUN_BUS": "redis",
        "AGW_REDIS_URL": redis.url,
    }
