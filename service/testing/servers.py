"""Throwaway PostgreSQL and Redis servers on loopback, for tests and benchmarks.

    with PostgresServer.start() as pg:           # initdb into a temp dir, postgres on a free port
        dsn = pg.create_database("t1")           # postgresql://postgres@127.0.0.1:<port>/t1
    with RedisServer.start() as redis:
        url = redis.url                          # redis://127.0.0.1:<port>/0
        with redis.frozen():                     # SIGSTOP (its processes too) until the block ends
            ...

Each server lives in its own temporary directory (data, unix socket, log), listens
on 127.0.0.1 only, keeps nothing durable (PostgreSQL with fsync off; Redis with no
snapshot and no append-only file), and is stopped and its directory removed on
exit. Nothing here needs Docker: the binaries are Debian's (`make install`).

PostgreSQL refuses to run as root. Run as root (as `make test` is in CI), the
cluster is created and served as the `postgres` system user, made by the Debian
package, which then owns the temporary directory; otherwise as the current user.
The cluster trusts every local connection, as the superuser `postgres`.

Missing binaries raise `ServerUnavailable`, whose message names `make install`.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

DEBIAN_POSTGRES_LIB = Path("/usr/lib/postgresql")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
_DATABASE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}\Z")


class ServerUnavailable(RuntimeError):
    """A throwaway server could not be started (its binaries are missing, or it failed)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def postgres_bindir(lib: Path = DEBIAN_POSTGRES_LIB) -> Path:
    """The directory of `initdb` and `postgres`: Debian keeps them off PATH, in
    /usr/lib/postgresql/<version>/bin (the newest version wins); PATH is tried first."""
    candidates: list[Path] = []
    for name in ("postgres", "initdb"):
        found = shutil.which(name)
        if found:
            candidates.append(Path(found).resolve().parent)
    versions = lib.glob("*/bin")
    candidates += sorted(versions, key=lambda p: _version_key(p.parent.name), reverse=True)
    for directory in candidates:
        if all((directory / tool).is_file() for tool in ("initdb", "postgres", "psql")):
            return directory
    raise ServerUnavailable(
        "PostgreSQL server binaries (initdb, postgres) not found on PATH or in "
        "/usr/lib/postgresql/<version>/bin: run `make install` (Debian package postgresql)"
    )


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", name)) or (0,)


def redis_binary() -> Path:
    """The `redis-server` binary on PATH."""
    found = shutil.which("redis-server")
    if found is None:
        raise ServerUnavailable(
            "redis-server not found on PATH: run `make install` (Debian package redis-server)"
        )
    return Path(found)


def _server_user() -> pwd.struct_passwd | None:
    """Whom PostgreSQL runs as: None for the current user, the `postgres` user under root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise ServerUnavailable(
            "PostgreSQL cannot run as root and there is no `postgres` user: run `make install` "
            "(the Debian package postgresql creates it), or run the tests as another user"
        ) from None


def _environment() -> dict[str, str]:
    """A plain environment: no PG* variables of the caller leak into the servers."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}


class _Process:
    """A server process in a temporary directory, stopped and removed as one."""

    name = "server"

    def __init__(self, directory: Path, port: int) -> None:
        self.directory = directory
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    def log_tail(self, size: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def _spawn(self, command: list[str], **options: Any) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                env=_environment(),
                start_new_session=True,  # a Ctrl-C of the tests does not hit the server first
                **options,
            )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._ready():
            if self.process is not None and self.process.poll() is not None:
                raise ServerUnavailable(
                    f"{self.name} exited with {self.process.returncode} on start:\n"
                    + self.log_tail()
                )
            if time.monotonic() > deadline:
                raise ServerUnavailable(f"{self.name} not ready after {START_TIMEOUT_S}s")
            time.sleep(0.02)

    def _ready(self) -> bool:
        raise NotImplementedError

    def stop(self, stop_signal: int = signal.SIGTERM) -> None:
        """Stop the server (it gets `stop_signal`, then SIGKILL) and remove its directory."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(stop_signal)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The server stopped (`SIGSTOP`) with every process it started, continued on exit:
        connections stay open and nothing answers, as with a hung host (failure drills)."""
        if self.process is None:
            raise ServerUnavailable(f"{self.name} is not running")
        stopped = _process_tree(self.process.pid)
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()


def _process_tree(root: int) -> list[int]:
    """`root` and its descendants (from /proc), parents first."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:  # "pid (comm) state ppid ...": comm may hold spaces and parentheses
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    tree, index = [root], 0
    while index < len(tree):
        tree += [child for child, parent in parents.items() if parent == tree[index]]
        index += 1
    return tree


Server = TypeVar("Server", bound=_Process)


def _start_with_retries(start: Callable[[int], Server]) -> Server:
    """Start on a free port; another process may take the port first, so try three times."""
    for _ in range(2):
        with contextlib.suppress(ServerUnavailable):
            return start(free_port())
    return start(free_port())


class PostgresServer(_Process):
    """A PostgreSQL cluster in a temporary directory, served on a free loopback port."""

    name = "postgres"
    user = "postgres"  # the cluster's superuser; every local connection is trusted

    def __init__(self, directory: Path, port: int, bindir: Path) -> None:
        super().__init__(directory, port)
        self.bindir = bindir

    @classmethod
    def start(cls) -> PostgresServer:
        """initdb a new cluster and serve it; raises ServerUnavailable on failure."""
        bindir = postgres_bindir()
        owner = _server_user()
        return _start_with_retries(lambda port: cls._start(bindir, owner, port))

    @classmethod
    def _start(cls, bindir: Path, owner: pwd.struct_passwd | None, port: int) -> PostgresServer:
        directory = Path(tempfile.mkdtemp(prefix="agw-postgres-"))
        server = cls(directory, port, bindir)
        try:
            as_owner: dict[str, Any] = {}
            if owner is not None:
                os.chown(directory, owner.pw_uid, owner.pw_gid)
                as_owner = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}
            initdb = subprocess.run(
                [
                    *(str(bindir / "initdb"), "-D", "data", "-U", cls.user, "--auth=trust"),
                    *("-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"),
                ],
                cwd=directory,
                env=_environment(),
                capture_output=True,
                check=False,
                **as_owner,
            )
            if initdb.returncode != 0:
                raise ServerUnavailable(
                    "initdb failed:\n" + (initdb.stdout + initdb.stderr).decode(errors="replace")
                )
            settings = {
                "listen_addresses": "127.0.0.1",
                "port": str(port),
                "unix_socket_directories": str(directory),
                "fsync": "off",
                "synchronous_commit": "off",
                "full_page_writes": "off",
                "max_connections": "300",
                "shared_buffers": "32MB",
                "log_min_messages": "warning",
            }
            options = [f"-c{key}={value}" for key, value in settings.items()]
            server._spawn([str(bindir / "postgres"), "-D", "data", *options], **as_owner)
            server._wait_ready()
        except BaseException:
            server.stop()
            raise
        return server

    def _ready(self) -> bool:
        # postmaster.pid's 8th line is the server's status ("ready" once it accepts connections)
        try:
            lines = (self.directory / "data" / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return len(lines) >= 8 and lines[7].strip() == "ready"

    def stop(self, stop_signal: int = signal.SIGINT) -> None:
        """Fast shutdown (SIGINT: running transactions are rolled back), then removal."""
        super().stop(stop_signal)

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run `sql` with psql; its output (tuples only, unaligned)."""
        done = subprocess.run(
            [
                *(str(self.bindir / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"),
                *("-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, "-d", database),
                *("-c", sql),
            ],
            env=_environment(),
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            raise ServerUnavailable(f"psql failed: {done.stderr.decode(errors='replace')}")
        return done.stdout.decode()

    def create_database(self, name: str) -> str:
        """A new, empty database; its DSN."""
        self.psql(f'CREATE DATABASE "{_checked(name)}"')
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop the database, ending the sessions still connected to it."""
        self.psql(f'DROP DATABASE IF EXISTS "{_checked(name)}" WITH (FORCE)')


def _checked(name: str) -> str:
    if not _DATABASE_NAME.match(name):
        raise ValueError(f"not a plain database name: {name!r}")
    return name


class RedisServer(_Process):
    """A redis-server with nothing persisted, on a free loopback port."""

    name = "redis-server"

    @classmethod
    def start(cls) -> RedisServer:
        """Serve a new, empty Redis; raises ServerUnavailable on failure."""
        binary = redis_binary()
        return _start_with_retries(lambda port: cls._start(binary, port))

    @classmethod
    def _start(cls, binary: Path, port: int) -> RedisServer:
        server = cls(Path(tempfile.mkdtemp(prefix="agw-redis-")), port)
        try:
            server._spawn(
                [
                    *(str(binary), "--port", str(port), "--bind", "127.0.0.1"),
                    *("--save", "", "--appendonly", "no", "--dir", str(server.directory)),
                    *("--unixsocket", str(server.socket_path), "--unixsocketperm", "700"),
                    *("--daemonize", "no", "--protected-mode", "yes"),
                ]
            )
            server._wait_ready()
        except BaseException:
            server.stop()
            raise
        return server

    @property
    def socket_path(self) -> Path:
        return self.directory / "redis.sock"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _ready(self) -> bool:
        try:
            return self.command("PING") == b"+PONG"
        except OSError:
            return False

    def command(self, *args: str) -> bytes:
        """Send one command; the first line of the reply (e.g. b"+OK")."""
        request = f"*{len(args)}\r\n".encode()
        for arg in args:
            data = arg.encode()
            request += b"$%d\r\n%s\r\n" % (len(data), data)
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as connection:
            connection.sendall(request)
            reply = b""
            while b"\r\n" not in reply:
                chunk = connection.recv(4096)
                if not chunk:
                    break
                reply += chunk
        return reply.split(b"\r\n", 1)[0]

    def flush(self) -> None:
        """Drop every key of every database."""
        if self.command("FLUSHALL") != b"+OK":
            raise ServerUnavailable("redis FLUSHALL failed")
