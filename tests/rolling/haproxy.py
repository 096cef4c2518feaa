"""HAProxy in front of replicas of the service, as docs/durable-runs.md configures it.

HAProxy (Debian's, 2.6) proxies gRPC: HTTP/2 without TLS on both sides (`proto h2`), one
request per stream, so that calls are spread over the replicas per call, not per
connection. It checks each replica through the gRPC health service: HAProxy 2.6's
`http-check send` cannot send the body of a gRPC request (its five bytes, the first
four NUL: `body` is a C string, `body-lf` stops at a NUL), so the check speaks HTTP/2
itself with `tcp-check send-binary`: the connection preface, an empty SETTINGS frame,
a HEADERS frame (`POST /grpc.health.v1.Health/Check`, literal HPACK fields) and a DATA
frame with an empty `HealthCheckRequest`; it waits for the answer's message
(`00 00000002 08 0X`), then passes only on `SERVING` (`08 01`): `NOT_SERVING`
(`08 02`, said from the moment the replica receives SIGTERM) turns it red at once.
"""

from __future__ import annotations

import asyncio
import csv
import io
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

HEALTH_PATH = b"/grpc.health.v1.Health/Check"
AUTHORITY = b"agw"


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    header = len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big")
    return header + payload


def _field(index: int, value: bytes) -> bytes:
    """An HPACK literal header field without indexing, its name from the static table."""
    prefix = bytes([index]) if index < 15 else bytes([0x0F, index - 15])
    return prefix + bytes([len(value)]) + value


def _named(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field without indexing, with a literal name."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def health_check_request() -> list[tuple[bytes, str]]:
    """`grpc.health.v1.Health/Check` with an empty request (the server's overall health), as
    the bytes a client sends on a new HTTP/2 connection without TLS, in pieces (one
    `tcp-check send-binary` each), each with what it is."""
    fields = [
        (b"\x83\x86", ":method POST, :scheme http"),
        (_field(4, HEALTH_PATH), ":path " + HEALTH_PATH.decode()),
        (_field(1, AUTHORITY), ":authority " + AUTHORITY.decode()),
        (_field(31, b"application/grpc"), "content-type application/grpc"),
        (_named(b"te", b"trailers"), "te trailers"),
    ]
    headers = _frame(0x1, 0x4, 1, b"".join(piece for piece, _ in fields))
    return [
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "the HTTP/2 connection preface"),
        (_frame(0x4, 0, 0, b""), "SETTINGS, none changed"),
        (headers[:9], "HEADERS, stream 1, END_HEADERS:"),
        *((piece, f"  {what}") for piece, what in fields),
        (_frame(0x0, 0x1, 1, b"\x00" * 5), "DATA, END_STREAM: an empty HealthCheckRequest"),
    ]


#: The backend's health-check lines (docs/durable-runs.md shows the same).
CHECK_LINES = (
    "option tcp-check",
    "tcp-check connect",
    *(f"tcp-check send-binary {piece.hex()}  # {what}" for piece, what in health_check_request()),
    "tcp-check expect rbinary 0000000002080[12]  # the answer's message: 08 01 or 08 02",
    "tcp-check expect min-recv 0 comment NOT_SERVING binary 00000000020801  # SERVING",
)


def config(port: int, servers: dict[str, int], socket: Path) -> str:
    """The configuration: a gRPC front end on `port`, the replicas `servers` (name: port)
    checked every 200 ms (one failed check marks one down, one passed check up again),
    and the runtime API on the Unix socket `socket`."""
    lines = [
        "global",
        "    maxconn 2000",
        f"    stats socket {socket} mode 600 level admin",
        "defaults",
        "    mode http",
        "    timeout connect 2s",
        "    timeout client 120s",
        "    timeout server 120s",
        "    timeout check 2s",
        "    retries 3",  # a connection refused (a replica gone) is tried on another
        "    option redispatch",
        "frontend grpc",
        f"    bind 127.0.0.1:{port} proto h2",
        "    default_backend agw",
        "backend agw",
        "    balance roundrobin",
        *(f"    {line}" for line in CHECK_LINES),
        "    default-server proto h2 check check-proto none inter 200ms fall 1 rise 1",
        *(f"    server {name} 127.0.0.1:{server}" for name, server in servers.items()),
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ServerState:
    """A server as HAProxy's `show stat` says: UP or DOWN, and its last check's outcome."""

    status: str
    check_status: str
    last_check: str


@dataclass
class HAProxy:
    """A running haproxy, its gRPC port and its runtime API."""

    process: asyncio.subprocess.Process
    port: int
    socket: Path
    log: Path

    @classmethod
    async def start(cls, directory: Path, port: int, servers: dict[str, int]) -> HAProxy:
        binary = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
        if binary is None:
            raise AssertionError("haproxy is not installed: run `make install` (Debian: haproxy)")
        socket = directory / "haproxy.sock"
        path = directory / "haproxy.cfg"
        path.write_text(config(port, servers, socket))
        log = directory / "haproxy.log"
        with log.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                binary, "-db", "-f", str(path), stdout=out, stderr=out
            )
        proxy = cls(process, port, socket, log)
        deadline = time.monotonic() + 30
        while True:
            if process.returncode is not None:
                raise AssertionError("haproxy did not start:\n" + log.read_text())
            try:
                await proxy.servers()
                return proxy
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    async def servers(self) -> dict[str, ServerState]:
        """The backend's servers, by name, as the runtime API shows them now."""
        reader, writer = await asyncio.open_unix_connection(str(self.socket))
        try:
            writer.write(b"show stat\n")
            await writer.drain()
            data = await reader.read()
        finally:
            writer.close()
        rows = csv.DictReader(io.StringIO(data.decode().lstrip("# ")))
        return {
            row["svname"]: ServerState(row["status"], row["check_status"], row["last_chk"])
            for row in rows
            if row["pxname"] == "agw" and row["svname"] not in ("BACKEND", "FRONTEND")
        }

    async def wait(self, name: str, status: str, timeout_s: float = 60.0) -> ServerState:
        """Wait until HAProxy shows server `name` with `status` (UP, DOWN)."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = (await self.servers()).get(name)
            if state is not None and state.status == status:
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"haproxy: server {name} is {state}, not {status}")
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
