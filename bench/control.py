"""The control channel of a benchmarked process: readiness, its own CPU and RSS, stop.

Each child process (provider, baseline, relay, gateway) answers `stats` on a
small TCP endpoint on loopback with one JSON line: its CPU time so far
(`getrusage`, all threads, µs resolution), its current RSS (`VmRSS`), and
whatever extra counters it registered; `flush` first runs the `flush` callback
it registered, if any (it exports the telemetry it buffers), then answers the
same. It announces itself with one line `READY {json}` on stdout and stops
when its stdin closes or on SIGTERM/SIGINT, so a child never outlives the
benchmark that started it.
"""

from __future__ import annotations

import asyncio
import json
import resource
import signal
import sys
from collections.abc import Callable
from typing import Any

from bench.protocol import HOST

Extra = Callable[[], dict[str, Any]]
COMMANDS = (b"stats", b"flush")


def process_stats() -> dict[str, Any]:
    """This process's CPU time (ns, user + system, every thread) and current RSS (KiB)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    rss_kib = 0
    with open("/proc/self/status", "rb") as status:
        for line in status:
            if line.startswith(b"VmRSS:"):
                rss_kib = int(line.split()[1])
                break
    cpu_ns = round((usage.ru_utime + usage.ru_stime) * 1e9)
    return {"cpu_ns": cpu_ns, "rss_kib": rss_kib}


class ControlServer:
    """Answers `stats\\n` or `flush\\n` with a JSON line; anything else closes the connection."""

    def __init__(self, extra: Extra | None = None, flush: Callable[[], None] | None = None) -> None:
        self.extra = extra
        self.flush = flush
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> ControlServer:
        self._server = await asyncio.start_server(self._serve, HOST, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (command := (await reader.readline()).strip()) in COMMANDS:
                if command == b"flush" and self.flush is not None:
                    self.flush()
                stats = process_stats()
                if self.extra is not None:
                    stats.update(self.extra())
                writer.write(json.dumps(stats).encode() + b"\n")
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


class ControlClient:
    """One connection to a child's control endpoint."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def connect(cls, port: int) -> ControlClient:
        reader, writer = await asyncio.open_connection(HOST, port)
        return cls(reader, writer)

    async def stats(self, command: str = "stats") -> dict[str, Any]:
        """The process's stats; with `command="flush"` it runs its flush callback first."""
        self._writer.write(command.encode() + b"\n")
        line = await self._reader.readline()
        if not line:
            raise ConnectionError("the benchmarked process went away")
        stats: dict[str, Any] = json.loads(line)
        return stats

    async def aclose(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()


def announce(**info: Any) -> None:
    """Tell the parent that this process is ready, and how to reach it."""
    sys.stdout.write("READY " + json.dumps(info) + "\n")
    sys.stdout.flush()


class _StdinWatch(asyncio.Protocol):
    def __init__(self, closed: asyncio.Event) -> None:
        self.closed = closed

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()


async def wait_for_stop() -> None:
    """Return on SIGTERM/SIGINT or when the parent closes our stdin."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    transport, _ = await loop.connect_read_pipe(lambda: _StdinWatch(stop), sys.stdin)
    try:
        await stop.wait()
    finally:
        transport.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
