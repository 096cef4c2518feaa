"""A sandbox's working directory: kept on disk, worked on in a tmpfs of the quota's size.

Why a tmpfs: a per-process `RLIMIT_FSIZE` bounds one file, not how many a
command writes, and measuring the directory before and after a call notices a
flood only once it is on the disk; filesystem quotas and loop-mounted images
need root and a prepared host. A tmpfs mounted with `--size` inside the
sandbox is bounded by the kernel at every write, needs no privilege, and
vanishes with the sandbox. So the command works on a copy:

1. Before the command starts, `Workspace.fill` copies the directory's saved
   content into the sandbox's empty tmpfs (over which bubblewrap mounts the
   directory's path, so the command sees the same path as the host).
2. The command reads and writes the copy; past the quota its writes fail with
   ENOSPC, as on a full disk.
3. When every process of the sandbox has ended, `Workspace.save` mirrors the
   copy back onto the directory (new, changed and deleted entries) -- unless
   the copy counts more than the quota (see `usage`), or is deeper than
   `MAX_DEPTH` directories: then the directory stays as it was and the call's
   changes are discarded.

The directory on disk therefore never holds more than the quota by that
count. Regular files, directories and symbolic links are kept (symlinks as
links, never followed); fifos and sockets are not; hard links become separate
copies; setuid, setgid and sticky bits are dropped. Entries at the top whose
names the sandbox mounts read-only (`.git`, shell start-up files) are neither
copied nor counted: they stay on the disk, untouched.

Copying runs in a worker thread (the event loop keeps serving), under an
exclusive `flock` of the directory so that calls on the same directory never
copy at the same time.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BLOCK = 4096
"""The unit of the quota's count: every kept entry takes at least one block."""

MAX_DEPTH = 64
"""How deep directories may nest in a working directory."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_SEND_CHUNK = 1 << 30


@dataclass(frozen=True)
class Usage:
    """The working directory after a command, by the quota's count.

    `used_bytes` is what the directory holds now; `full` says the command ran
    its copy out of space (or over the limits); `saved` is False when the
    directory was left as it was: the copy was over the limits (`full` too) or
    the sandbox did not end.
    """

    used_bytes: int
    quota_bytes: int
    full: bool
    saved: bool


class _OverLimit(Exception):
    """The tree counts more than the limit, or nests too deep."""


def usage(directory: int, limit: int, keep: frozenset[str] = frozenset()) -> int | None:
    """What the tree under the open `directory` counts; None once past `limit` or too deep.

    A regular file counts its size rounded up to whole blocks; an empty file,
    a directory and a symbolic link one block each; the top directory itself
    and the `keep` entries at the top nothing.
    """
    total = 0

    def walk(fd: int, depth: int) -> None:
        nonlocal total
        for name, st in _entries(fd):
            if depth == 0 and name in keep:
                continue
            total += _cost(st)
            if total > limit:
                raise _OverLimit
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 > MAX_DEPTH:
                    raise _OverLimit
                child = _open_dir(name, fd, st)
                try:
                    walk(child, depth + 1)
                finally:
                    os.close(child)

    try:
        walk(directory, 0)
    except _OverLimit:
        return None
    return total


def mirror(source: int, target: int, keep: frozenset[str] = frozenset()) -> None:
    """Make the tree under `target` equal to the one under `source` (both open directories).

    Unchanged files (same size and modification time) are not copied again;
    the `keep` entries at the top of either side, and the mode and times of
    `target` itself, are left alone.
    """
    _mirror(source, target, keep, 0)


class Workspace:
    """One call's working directory on disk and its copy in the sandbox."""

    def __init__(self, directory: Path, quota_bytes: int, keep: frozenset[str]) -> None:
        self.directory = directory
        self.quota_bytes = quota_bytes
        self.keep = keep
        self.fd = os.open(directory, _DIR_FLAGS)
        self.copy: int | None = None
        self.filled = False
        self._work: asyncio.Future[Any] | None = None

    async def held_bytes(self) -> int | None:
        """What the directory holds by the quota's count; None when over the quota."""
        result: int | None = await self._in_thread(usage, self.fd, self.quota_bytes, self.keep)
        return result

    def attach(self, copy: int) -> None:
        """Take the open root of the sandbox's tmpfs, once it is checked to be that tmpfs."""
        found = os.fstatvfs(copy)
        pages = -(-self.quota_bytes // found.f_frsize)
        fresh = found.f_blocks == pages and found.f_bfree == found.f_blocks
        if os.fstat(copy).st_dev == os.fstat(self.fd).st_dev or not fresh:
            os.close(copy)
            raise OSError(f"{self.directory} in the sandbox is not its fresh tmpfs")
        self.copy = copy

    async def fill(self) -> None:
        """Copy the directory into the attached tmpfs."""
        assert self.copy is not None
        await self._in_thread(mirror, self.fd, self.copy, self.keep)
        self.filled = True

    async def save(self) -> Usage:
        """Mirror the tmpfs back onto the directory if it is within the limits."""
        assert self.copy is not None and self.filled
        result: Usage = await self._in_thread(self._save, self.copy)
        return result

    async def unsaved(self) -> Usage:
        """The outcome when the call's changes cannot be kept (the sandbox did not end)."""
        held = await self.held_bytes()
        return Usage(held or 0, self.quota_bytes, full=False, saved=False)

    def _save(self, copy: int) -> Usage:
        full = os.fstatvfs(copy).f_bavail == 0
        used = usage(copy, self.quota_bytes, self.keep)
        if used is None:
            held = usage(self.fd, self.quota_bytes, self.keep)
            return Usage(held or 0, self.quota_bytes, full=True, saved=False)
        mirror(copy, self.fd, self.keep)
        return Usage(used, self.quota_bytes, full, saved=True)

    async def aclose(self) -> None:
        """Release both directories, once no copy is running."""
        if self._work is not None:
            await asyncio.wait({self._work})
        if self.copy is not None:
            os.close(self.copy)
            self.copy = None
        os.close(self.fd)

    async def _in_thread(self, func: Callable[..., Any], *args: Any) -> Any:
        """Run `func` in a thread, holding the directory's lock; a cancelled caller's runs on."""
        self._work = asyncio.ensure_future(asyncio.to_thread(self._locked, func, *args))
        return await asyncio.shield(self._work)

    def _locked(self, func: Callable[..., Any], *args: Any) -> Any:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            return func(*args)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)


def _mirror(source: int, target: int, keep: frozenset[str], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise OSError(f"directories nest deeper than {MAX_DEPTH}")
    wanted = {
        name: st
        for name, st in _entries(source)
        if _kept_kind(st) and not (depth == 0 and name in keep)
    }
    if depth:
        os.fchmod(target, stat.S_IRWXU)
    present: dict[str, os.stat_result] = {}
    for name, st in _entries(target):
        if depth == 0 and name in keep:
            continue
        want = wanted.get(name)
        if want is not None and _same(name, source, want, target, st):
            present[name] = st
        elif stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=target)
        else:
            os.unlink(name, dir_fd=target)
    for name, st in wanted.items():
        if stat.S_ISDIR(st.st_mode):
            if name not in present:
                os.mkdir(name, 0o700, dir_fd=target)
            src = _open_dir(name, source, st)
            try:
                dst = _open_dir(name, target, present.get(name, st))
                try:
                    _mirror(src, dst, frozenset(), depth + 1)
                finally:
                    os.close(dst)
            finally:
                os.close(src)
        elif stat.S_ISLNK(st.st_mode):
            if name not in present:
                os.symlink(os.readlink(name, dir_fd=source), name, dir_fd=target)
        elif name in present:
            if _mode(present[name]) != _mode(st):
                os.chmod(name, _mode(st), dir_fd=target)
        else:
            _copy_file(name, source, target, st)
    if depth:
        mine = os.fstat(source)
        os.fchmod(target, _mode(mine))
        os.utime(target, ns=(mine.st_atime_ns, mine.st_mtime_ns))


def _copy_file(name: str, source: int, target: int, st: os.stat_result) -> None:
    """Copy `st.st_size` bytes of a regular file, its mode (less special bits) and times."""
    src = _open(name, source, st, _READ_FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            raise OSError(f"{name} changed while it was copied")
        dst = os.open(name, _CREATE_FLAGS, 0o600, dir_fd=target)
        try:
            offset = 0
            while offset < st.st_size:
                sent = os.sendfile(dst, src, offset, min(st.st_size - offset, _SEND_CHUNK))
                if sent == 0:
                    break
                offset += sent
            os.fchmod(dst, _mode(st))
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _same(name: str, source: int, want: os.stat_result, target: int, have: os.stat_result) -> bool:
    """True when the entry already on the target side need not be replaced."""
    if stat.S_IFMT(want.st_mode) != stat.S_IFMT(have.st_mode):
        return False
    if stat.S_ISREG(want.st_mode):
        return (want.st_size, want.st_mtime_ns) == (have.st_size, have.st_mtime_ns)
    if stat.S_ISLNK(want.st_mode):
        return os.readlink(name, dir_fd=source) == os.readlink(name, dir_fd=target)
    return True


def _entries(directory: int) -> list[tuple[str, os.stat_result]]:
    """The names in an open directory with their own (not followed) status."""
    with os.scandir(directory) as found:
        return [(entry.name, entry.stat(follow_symlinks=False)) for entry in found]


def _cost(st: os.stat_result) -> int:
    if stat.S_ISREG(st.st_mode):
        return max(BLOCK, -(-st.st_size // BLOCK) * BLOCK)
    return BLOCK if _kept_kind(st) else 0


def _kept_kind(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)


def _mode(st: os.stat_result) -> int:
    return stat.S_IMODE(st.st_mode) & 0o777


def _open_dir(name: str, parent: int, st: os.stat_result) -> int:
    return _open(name, parent, st, _DIR_FLAGS)


def _open(name: str, parent: int, st: os.stat_result, flags: int) -> int:
    """Open an entry without following links; one its owner may not read gets u+r(x) first."""
    try:
        return os.open(name, flags, dir_fd=parent)
    except PermissionError:
        extra = stat.S_IRWXU if stat.S_ISDIR(st.st_mode) else stat.S_IRUSR
        os.chmod(name, _mode(st) | extra, dir_fd=parent)
        return os.open(name, flags, dir_fd=parent)
