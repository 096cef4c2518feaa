"""A shell command run inside a sandbox the kernel enforces.

The command runs under bubblewrap in fresh user, pid, mount, ipc, uts, cgroup
and (unless the policy allows it) network namespaces, as uid/gid 65534, with no
capabilities, a scrubbed environment, a read-only view of the system (/usr, the
/bin and /lib links, a few /etc files), fresh /proc, /dev, /tmp and /dev/shm,
and read-write only the working directory and the allowed paths. Allowed paths
are bound by open file descriptor, so what is mounted is what was checked;
nothing else of the host exists inside, so a symlink pointing outside leads
nowhere. `.git` and shell start-up files found at the top of a writable path
are mounted read-only.

The working directory is seen at its own path, but what is mounted there is a
tmpfs of `workspace_quota_bytes`, filled with the directory's content before
the command starts and mirrored back after the sandbox has ended
(`service.builtins.workspace`, which explains why): the kernel bounds every
write, so the directory on disk never grows past the quota. The command
starts only once its copy is filled: a first shell step tells the gateway the
sandbox is set up, waits for the word to go, then runs the command.

Processes and memory are bounded by a child cgroup (cgroup2, or the cgroup1
`pids` and `memory` hierarchies) when the host lets us create one; rlimits add
file size, CPU time and core limits and stand in for a missing memory
controller. As root, RLIMIT_NPROC is not enforced (the sandbox's uid maps back
to root), so without a `pids` cgroup a root gateway refuses to run commands
rather than leave a fork bomb unbounded.

When the call returns, nothing of the command survives: the sandbox's pid 1 is
killed (its pid namespace dies with it), the process group too, and the cgroup
is emptied and removed: on time-out, on output overflow and when the calling
task is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import stat
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.builtins.workspace import Usage, Workspace
from service.core.errors import SandboxUnavailable

logger = logging.getLogger("agw.tools.bash")

SANDBOX_UID = 65534
"""The uid and gid the command runs as inside the sandbox."""

FILE_SIZE_LIMIT_BYTES = 512 * 1024 * 1024
"""The largest file the command may write (RLIMIT_FSIZE)."""

HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
"""Where the host tools (bwrap, prlimit, sh) are looked up."""

CGROUP_MOUNT = Path("/sys/fs/cgroup")
"""Where the cgroup hierarchies are mounted."""

BASH = Path("/usr/bin/bash")
"""The shell that runs the command (from the host's /usr, mounted read-only)."""

_SANDBOX_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
}
_SYSTEM_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_ETC = ("alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf")
_ETC_NETWORK = ("hosts", "resolv.conf", "host.conf", "gai.conf", "ssl/certs", "ssl/openssl.cnf")
PROTECTED = (".git", ".bashrc", ".bash_profile", ".bash_login", ".profile", ".zshrc", ".envrc")
_PASSWD = (
    f"root:x:0:0:root:/:/usr/sbin/nologin\nsandbox:x:{SANDBOX_UID}:{SANDBOX_UID}::/tmp:/bin/sh\n"
)
_GROUP = f"root:x:0:\nsandbox:x:{SANDBOX_UID}:\n"
_JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
_TMPFS_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_CHUNK = 65536
_REAP_TIMEOUT_S = 5.0
_SETUP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SandboxPolicy:
    """Where a command may write and how much it may use."""

    working_dir: Path
    allowed_paths: tuple[Path, ...]
    timeout_s: float = 10
    output_limit_bytes: int = 64_000
    memory_limit_bytes: int = 256 * 1024 * 1024
    max_processes: int = 64
    network: bool = False
    workspace_quota_bytes: int = 256 * 1024 * 1024


@dataclass(frozen=True)
class SandboxResult:
    """What a command printed and how it ended.

    `exit_code` is None when the command was killed for its time-out or its
    output; a command killed by a signal inside reports 128 + the signal.
    `stdout` and `stderr` together hold at most `output_limit_bytes` bytes.
    `workspace` tells what became of the working directory.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    truncated: bool
    duration_ms: float
    workspace: Usage | None = None


#: Told each chunk of a command's output as it comes: ("stdout" or "stderr", the bytes kept).
OutputListener = Callable[[str, bytes], None]


async def run_sandboxed(
    command: str, policy: SandboxPolicy, on_output: OutputListener | None = None
) -> SandboxResult:
    """Run `command` with bash inside the sandbox `policy` describes.

    `on_output` is told each chunk of output as it is read (within the output limit).

    Raises SandboxUnavailable when the sandbox cannot be built (or the working
    directory already holds more than its quota); cancelling the calling task
    kills the command, keeps what it wrote, and re-raises CancelledError.
    Concurrent calls on one working directory each work on their own copy; the
    last to end is what the directory keeps.
    """
    started = time.monotonic()
    tools = _host_tools()
    fds = _Fds()
    cgroup: _Cgroup | None = None
    workspace: Workspace | None = None
    try:
        mounts, keep = _mount_args(policy, fds)
        workspace = Workspace(_real(policy.working_dir), policy.workspace_quota_bytes, keep)
        if await workspace.held_bytes() is None:
            raise SandboxUnavailable(
                f"the working directory {policy.working_dir} holds more than its quota of "
                f"{policy.workspace_quota_bytes} bytes (or nests deeper than allowed)"
            )
        cgroup = _Cgroup.create(policy.max_processes, policy.memory_limit_bytes)
        if not cgroup.limits_pids and os.geteuid() == 0:
            raise SandboxUnavailable(
                "no writable cgroup with a pids controller: as root, RLIMIT_NPROC cannot bound "
                "the number of processes"
            )
        info_read, info_write = os.pipe()
        ready_read, ready_write = os.pipe()
        go_read, go_write = os.pipe()
        fds.parent += [info_read, ready_read, go_write]
        fds.child += [info_write, ready_write, go_read]
        argv = [str(tools["prlimit"]), *_rlimits(policy, cgroup.limits_memory), "--"]
        argv += [str(tools["bwrap"]), *_namespace_args(policy, info_write, fds), *mounts]
        argv += [*_shell(), _handshake(ready_write, go_read), "agw-sandbox", command]
        if cgroup.dirs:
            procs = [str(d / "cgroup.procs") for d in cgroup.dirs]
            argv = [str(tools["sh"]), "-c", _JOIN_CGROUPS, "agw-sandbox", *procs, "--", *argv]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": HOST_PATH, "LANG": "C.UTF-8"},
            start_new_session=True,
            pass_fds=fds.child,
        )
        fds.close_child()
        fds.parent.remove(info_read)
        execution = _Execution(proc, info_read, cgroup, policy, on_output)
        outcome: Usage | None = None
        try:
            await execution.prepare(workspace, ready_read, go_write)
            result = await execution.collect(started)
        finally:
            await asyncio.shield(execution.reap())
            if workspace.filled:
                outcome = await (workspace.save() if execution.ended else workspace.unsaved())
        return dataclasses.replace(result, workspace=outcome)
    finally:
        fds.close_all()
        if workspace is not None:
            await asyncio.shield(workspace.aclose())
        if cgroup is not None:
            await asyncio.shield(cgroup.remove())


def _host_tools() -> dict[str, str]:
    """Where bwrap, prlimit and sh are; bash must be in /usr too."""
    tools = {name: shutil.which(name, path=HOST_PATH) for name in ("bwrap", "prlimit", "sh")}
    missing = sorted(name for name, found in tools.items() if found is None)
    if not BASH.exists():
        missing.append(str(BASH))
    if missing:
        raise SandboxUnavailable(f"missing host tools: {', '.join(missing)}")
    return {name: str(found) for name, found in tools.items()}


class _Fds:
    """File descriptors handed to bwrap, and the parent's own ends."""

    def __init__(self) -> None:
        self.child: list[int] = []
        self.parent: list[int] = []

    def data(self, text: str) -> int:
        """The read end of a pipe already holding `text` (small enough for its buffer)."""
        read, write = os.pipe()
        self.child.append(read)
        try:
            os.write(write, text.encode())
        finally:
            os.close(write)
        return read

    def path(self, path: Path, *, follow: bool) -> int | None:
        """An O_PATH descriptor of `path`: None if missing, or a symlink when not `follow`."""
        flags = os.O_PATH | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        self.child.append(fd)
        return fd

    def close_child(self) -> None:
        while self.child:
            os.close(self.child.pop())

    def close_all(self) -> None:
        self.close_child()
        while self.parent:
            os.close(self.parent.pop())


def _namespace_args(policy: SandboxPolicy, info_fd: int, fds: _Fds) -> list[str]:
    """Namespaces, identity, session and environment of the sandbox."""
    uid = str(SANDBOX_UID)
    args = ["--unshare-all", "--unshare-user", "--disable-userns", "--uid", uid, "--gid", uid]
    if policy.network:
        args.append("--share-net")
    args += ["--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "sandbox"]
    args += ["--info-fd", str(info_fd), "--clearenv", "--chdir", str(_real(policy.working_dir))]
    for name, value in _SANDBOX_ENV.items():
        args += ["--setenv", name, value]
    args += ["--ro-bind-data", str(fds.data(_PASSWD)), "/etc/passwd"]
    args += ["--ro-bind-data", str(fds.data(_GROUP)), "/etc/group"]
    return args


def _mount_args(policy: SandboxPolicy, fds: _Fds) -> tuple[list[str], frozenset[str]]:
    """The filesystem: system read-only, fresh /proc /dev /tmp, the working directory's
    tmpfs, allowed paths by fd; and the names mounted read-only at the top of the
    working directory."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _SYSTEM_DIRS:
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    for name in _ETC + (_ETC_NETWORK if policy.network else ()):
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    size = str(policy.memory_limit_bytes)
    args += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--tmpfs", "/dev/shm"]
    args += ["--size", size, "--tmpfs", "/tmp"]
    working_dir = _real(policy.working_dir)
    if not working_dir.is_dir():
        raise SandboxUnavailable(f"working directory {policy.working_dir} is not a directory")
    allowed = dict.fromkeys(_real(p) for p in policy.allowed_paths)
    if Path("/") in allowed:
        raise SandboxUnavailable("the root directory cannot be a writable path")
    for path in allowed:
        if path == working_dir or working_dir in path.parents:
            raise SandboxUnavailable(f"allowed path {path} is inside the working directory")
    keep: frozenset[str] = frozenset()
    for path in sorted([working_dir, *allowed], key=lambda p: len(p.parts)):
        if path == working_dir:
            args += ["--size", str(policy.workspace_quota_bytes), "--tmpfs", str(path)]
        else:
            fd = fds.path(path, follow=False)
            if fd is None:
                raise SandboxUnavailable(f"allowed path {path} changed while the sandbox was built")
            args += ["--bind-fd", str(fd), str(path)]
        if path.is_dir():
            protected = _protect(path, fds)
            for name, fd in protected.items():
                args += ["--ro-bind-fd", str(fd), str(path / name)]
            if path == working_dir:
                keep = frozenset(protected)
    return [*args, "--remount-ro", "/"], keep


def _protect(directory: Path, fds: _Fds) -> dict[str, int]:
    """Repository metadata and shell start-up files to mount read-only (never via a symlink)."""
    found: dict[str, int] = {}
    for name in PROTECTED:
        fd = fds.path(directory / name, follow=False)
        if fd is not None:
            found[name] = fd
    return found


def _real(path: Path) -> Path:
    try:
        return path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise SandboxUnavailable(f"path {path} does not exist") from exc


def _rlimits(policy: SandboxPolicy, memory_by_cgroup: bool) -> list[str]:
    """prlimit options: processes, file size, CPU seconds, no core; memory without a cgroup."""
    cpu = math.ceil(policy.timeout_s) + 1
    limits = [f"--nproc={policy.max_processes}", f"--fsize={FILE_SIZE_LIMIT_BYTES}"]
    limits += [f"--cpu={cpu}", "--core=0"]
    if not memory_by_cgroup:
        limits.append(f"--as={policy.memory_limit_bytes}")
    return limits


def _shell() -> list[str]:
    return [str(BASH), "--noprofile", "--norc", "-c"]


def _handshake(ready: int, go: int) -> str:
    """The sandbox's first step: say it is set up, wait for its working directory, then run
    the command (`$1`) in a fresh shell, with neither pipe open."""
    return (
        f"printf 1 >&{ready}; exec {ready}>&-; read -r go <&{go}; exec {go}<&-; "
        f'[ "$go" = go ] || exit 125; exec {" ".join(_shell())} "$1"'
    )


class _Cgroup:
    """A child cgroup holding one sandbox: one directory (cgroup2) or one per hierarchy."""

    def __init__(self) -> None:
        self.dirs: list[Path] = []
        self.limits_pids = False
        self.limits_memory = False

    @classmethod
    def create(cls, max_processes: int, memory_bytes: int) -> _Cgroup:
        """Create the child cgroup where the host allows it; an empty one otherwise."""
        group = cls()
        name = f"agw-sandbox-{uuid.uuid4().hex}"
        own = _own_cgroups()
        try:
            if (CGROUP_MOUNT / "cgroup.controllers").exists():
                group._create_v2(own.get("", "/"), name, max_processes, memory_bytes)
            else:
                group._create_v1(own, name, max_processes, memory_bytes)
        except BaseException:
            for directory in group.dirs:
                with contextlib.suppress(OSError):
                    directory.rmdir()
            raise
        return group

    def _create_v2(self, own: str, name: str, max_processes: int, memory_bytes: int) -> None:
        for parent in dict.fromkeys([CGROUP_MOUNT / own.lstrip("/"), CGROUP_MOUNT]):
            wanted = {"pids", "memory"} & set(_read(parent / "cgroup.controllers").split())
            missing = wanted - set(_read(parent / "cgroup.subtree_control").split())
            if not wanted or (missing and not _write(parent / "cgroup.subtree_control", missing)):
                continue
            child = parent / name
            with contextlib.suppress(OSError):
                child.mkdir()
                self.dirs.append(child)
                self.limits_pids = _write(child / "pids.max", max_processes)
                self.limits_memory = _write(child / "memory.max", memory_bytes)
                _write(child / "memory.swap.max", 0)
                return

    def _create_v1(self, own: dict[str, str], name: str, max_processes: int, memory: int) -> None:
        for controller, limit_file, value in (
            ("pids", "pids.max", max_processes),
            ("memory", "memory.limit_in_bytes", memory),
        ):
            hierarchy = CGROUP_MOUNT / controller
            if controller not in own or not (hierarchy / "cgroup.procs").exists():
                continue
            for parent in dict.fromkeys([hierarchy / own[controller].lstrip("/"), hierarchy]):
                child = parent / name
                try:
                    child.mkdir()
                except OSError:
                    continue
                self.dirs.append(child)
                limited = _write(child / limit_file, value)
                if controller == "pids":
                    self.limits_pids = limited
                else:
                    self.limits_memory = limited
                    _write(child / "memory.memsw.limit_in_bytes", memory)
                break

    def kill_all(self) -> None:
        """SIGKILL every process in the group."""
        for directory in self.dirs:
            if (directory / "cgroup.kill").exists() and _write(directory / "cgroup.kill", 1):
                continue
            for pid in _read(directory / "cgroup.procs").split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)

    async def remove(self) -> None:
        """Kill what is left, then remove the directories once they are empty."""
        delay = 0.002
        deadline = time.monotonic() + _REAP_TIMEOUT_S
        while self.dirs:
            self.kill_all()
            for directory in list(self.dirs):
                try:
                    directory.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    continue
                self.dirs.remove(directory)
            if self.dirs and time.monotonic() > deadline:
                logger.warning("sandbox cgroup not removed: %s", ", ".join(map(str, self.dirs)))
                return
            if self.dirs:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.1)


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup path per controller ('' for the cgroup2 hierarchy)."""
    paths: dict[str, str] = {}
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            paths[controller] = path
    return paths


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, value: object) -> bool:
    """Write a cgroup control file; False if the kernel refuses."""
    text = " ".join(f"+{v}" for v in sorted(value)) if isinstance(value, set) else str(value)
    try:
        path.write_text(text)
    except OSError:
        return False
    return True


class _Execution:
    """One running sandbox: its output, its pid 1 and how it ends."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        info_fd: int,
        cgroup: _Cgroup,
        policy: SandboxPolicy,
        on_output: OutputListener | None = None,
    ) -> None:
        self.proc = proc
        self.on_output = on_output
        self.cgroup = cgroup
        self.policy = policy
        self.info_file = os.fdopen(info_fd, "rb", buffering=0)
        self.info = asyncio.ensure_future(self._read_info())
        self.child_pid: int | None = None
        self.init_pidfd: int | None = None
        self.total = 0
        self.truncated = False
        self.killed = False
        self.ended = False
        self.overflow = asyncio.Event()

    async def prepare(self, workspace: Workspace, ready_fd: int, go_fd: int) -> None:
        """Once the sandbox is set up, fill its working directory, then let the command start.

        Returns at once if the sandbox ended before it was set up (`collect` reports why).
        """
        try:
            ready = await asyncio.wait_for(_read_once(ready_fd), _SETUP_TIMEOUT_S)
        except TimeoutError:
            raise SandboxUnavailable("the sandbox was not set up in time") from None
        if ready != b"1":
            return
        await asyncio.wait({self.info}, timeout=_REAP_TIMEOUT_S)
        if self.init_pidfd is None:
            raise SandboxUnavailable("the sandbox's pid 1 is unknown")
        root = f"/proc/{self.child_pid}/root{workspace.directory}"
        try:
            workspace.attach(os.open(root, _TMPFS_FLAGS))
            await workspace.fill()
        except OSError as exc:
            raise SandboxUnavailable(
                f"the working directory could not be copied in: {exc}"
            ) from exc
        os.write(go_fd, b"go\n")

    async def collect(self, started: float) -> SandboxResult:
        """Read both streams until the command ends, times out or floods its output."""
        assert self.proc.stdout is not None and self.proc.stderr is not None
        out, err = bytearray(), bytearray()
        finished = asyncio.gather(
            self._pump(self.proc.stdout, out, "stdout"),
            self._pump(self.proc.stderr, err, "stderr"),
            self.proc.wait(),
        )
        overflow = asyncio.ensure_future(self.overflow.wait())
        waiters: set[asyncio.Future[Any]] = {finished, overflow}
        try:
            done, _ = await asyncio.wait(
                waiters,
                timeout=self.policy.timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
            timed_out = not done
            if finished not in done:
                await self.kill()
                await asyncio.wait({finished}, timeout=_REAP_TIMEOUT_S)
            duration_ms = (time.monotonic() - started) * 1000
            await asyncio.wait({self.info}, timeout=_REAP_TIMEOUT_S)
        finally:
            for task in (finished, overflow):
                task.cancel()
                task.add_done_callback(_retrieved)  # a cancelled gather ends "failed"
        if not self.killed and self._setup_failed():
            text = err.decode(errors="replace").strip()
            raise SandboxUnavailable(f"the sandbox could not start: {text}")
        return SandboxResult(
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            exit_code=None if self.killed else self.proc.returncode,
            timed_out=timed_out,
            truncated=self.truncated,
            duration_ms=duration_ms,
        )

    async def kill(self) -> None:
        """Kill the sandbox's pid 1 (its namespace dies with it), then the cgroup and group."""
        if self.proc.returncode is None:
            self.killed = True
        if self.init_pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.init_pidfd, signal.SIGKILL)
            # bwrap reaps its pid 1 and exits by itself; the rest is for when it lingers.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 1.0)
        self.cgroup.kill_all()
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    async def reap(self) -> None:
        """Make sure nothing of the sandbox runs any more, then release its descriptors.

        Sets `ended` once the sandbox's pid 1, and so every process inside, is gone.
        """
        try:
            if self.proc.returncode is None:
                await self.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), _REAP_TIMEOUT_S)
            self.info.cancel()
            await asyncio.wait({self.info})
            if self.init_pidfd is not None:
                self.ended = await self._wait_init_gone()
        finally:
            self.info_file.close()
            if self.init_pidfd is not None:
                os.close(self.init_pidfd)
                self.init_pidfd = None

    async def _pump(self, stream: asyncio.StreamReader, buffer: bytearray, name: str) -> None:
        """Append what `stream` sends while the shared output budget lasts; drain the rest."""
        while chunk := await stream.read(_READ_CHUNK):
            room = self.policy.output_limit_bytes - self.total
            if len(chunk) > room:
                chunk = chunk[: max(room, 0)]
                self.truncated = True
                self.overflow.set()
            buffer += chunk
            self.total += len(chunk)
            if chunk and self.on_output is not None:
                self.on_output(name, chunk)

    async def _read_info(self) -> None:
        """Learn the sandbox's pid 1 from bwrap's info descriptor and hold a pidfd on it."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), self.info_file
        )
        data = b""
        try:
            while chunk := await reader.read(4096):
                data += chunk
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    pid = int(json.loads(data)["child-pid"])
                    break
            else:
                return
        finally:
            transport.close()
        self.child_pid = pid
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        stat_line = _read(Path(f"/proc/{pid}/stat"))
        fields = stat_line.rpartition(")")[2].split()
        if len(fields) > 1 and int(fields[1]) == self.proc.pid:
            self.init_pidfd = pidfd
        else:
            os.close(pidfd)

    def _setup_failed(self) -> bool:
        """True when bwrap (or the cgroup join) ended before creating the sandbox."""
        return self.info.done() and self.child_pid is None

    async def _wait_init_gone(self) -> bool:
        """Wait until the sandbox's pid 1 has exited: then its whole pid namespace has."""
        assert self.init_pidfd is not None
        loop = asyncio.get_running_loop()
        gone: asyncio.Future[None] = loop.create_future()

        def exited() -> None:
            if not gone.done():
                gone.set_result(None)

        loop.add_reader(self.init_pidfd, exited)
        try:
            await asyncio.wait_for(gone, _REAP_TIMEOUT_S)
        except TimeoutError:
            logger.warning("sandbox pid 1 still running after %.0f s", _REAP_TIMEOUT_S)
            return False
        finally:
            loop.remove_reader(self.init_pidfd)
        return True


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Mark the outcome of `future` as seen, so that asyncio does not log it as lost."""
    if not future.cancelled():
        future.exception()


async def _read_once(fd: int) -> bytes:
    """What a pipe holds once it can be read (b"" at its end)."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await readable
    finally:
        loop.remove_reader(fd)
    return os.read(fd, 16)
