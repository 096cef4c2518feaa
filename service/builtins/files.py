"""The chats' `_bash_` workspaces, read: what `ListFiles` lists and `DownloadFile` reads, and
what a call changed (`file.create`, `file.update`).

A workspace is `{working_dir}/chats/{chatId}` (service/builtins/bash.py). Only regular files
are shown: symbolic links are never followed (a link planted by a command to a file outside
is not a file of the workspace), nor are directories nested deeper than the sandbox allows;
the entries the sandbox keeps read-only at the top (`.git`, shell start-up files) are the
operator's, not the tools' output, and are left out. A path is opened one component at a
time below the workspace with `O_NOFOLLOW`, so neither `..` nor a link leads out of it.
Reading and walking run in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import mimetypes
import os
import stat
from pathlib import Path

from service.builtins.sandbox import PROTECTED
from service.builtins.workspace import MAX_DEPTH
from service.core.errors import NotFound, PayloadTooLarge
from service.core.files import FileContent, WorkspaceFile

#: The most files ListFiles lists of one workspace (the first ones by path).
MAX_LISTED = 10_000
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

#: A workspace's files and how each stood: path → (size, modification time in ns).
Snapshot = dict[str, tuple[int, int]]


def mime_type_of(path: str) -> str:
    """The MIME type a file's name suggests."""
    return mimetypes.guess_type(path, strict=False)[0] or "application/octet-stream"


def snapshot(directory: Path) -> Snapshot:
    """The regular files under `directory` (none when it does not exist), as they stand."""
    found: Snapshot = {}
    try:
        top = os.open(directory, _DIR_FLAGS)
    except OSError:
        return found
    try:
        _walk(top, "", 0, found)
    finally:
        os.close(top)
    return found


def _walk(directory: int, prefix: str, depth: int, found: Snapshot) -> None:
    if depth > MAX_DEPTH:
        return
    with os.scandir(directory) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if not prefix and entry.name in PROTECTED:
                continue
            path = prefix + entry.name
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                found[path] = (info.st_size, info.st_mtime_ns)
            elif stat.S_ISDIR(info.st_mode):
                try:
                    child = os.open(entry.name, _DIR_FLAGS, dir_fd=directory)
                except OSError:
                    continue
                try:
                    _walk(child, path + "/", depth + 1, found)
                finally:
                    os.close(child)
            if len(found) >= MAX_LISTED:
                return


def changes(before: Snapshot, after: Snapshot) -> list[tuple[str, int, bool]]:
    """The files created or changed from `before` to `after`: (path, size, created)."""
    return [
        (path, size, path not in before)
        for path, (size, mtime) in after.items()
        if before.get(path) != (size, mtime)
    ]


class WorkspaceReader:
    """The `WorkspaceFiles` of the chats' workspaces under `chats_dir`."""

    def __init__(self, chats_dir: Path) -> None:
        self.chats_dir = chats_dir

    async def list(self, chat_id: str) -> list[WorkspaceFile]:
        found = await asyncio.to_thread(snapshot, self.chats_dir / chat_id)
        return [
            WorkspaceFile(path, size, mime_type_of(path), mtime // 1_000_000)
            for path, (size, mtime) in found.items()
        ]

    async def read(
        self, chat_id: str, path: str, max_bytes: int, chunk_bytes: int
    ) -> tuple[WorkspaceFile, FileContent]:
        fd, info = await asyncio.to_thread(self._open, chat_id, path)
        if info.st_size > max_bytes:
            os.close(fd)
            raise PayloadTooLarge(
                f"file {path!r} is {info.st_size} bytes; downloads are limited to {max_bytes}"
            )
        file = WorkspaceFile(path, info.st_size, mime_type_of(path), info.st_mtime_ns // 1_000_000)
        return file, _Chunks(fd, info.st_size, chunk_bytes)

    def _open(self, chat_id: str, path: str) -> tuple[int, os.stat_result]:
        parts = path.split("/")
        missing = NotFound(f"no file {path[:200]!r} in the workspace of chat {chat_id!r}")
        if (
            not path
            or "\0" in path
            or any(part in ("", ".", "..") for part in parts)
            or parts[0] in PROTECTED
            or len(parts) > MAX_DEPTH
        ):
            raise missing
        try:
            directory = os.open(self.chats_dir / chat_id, _DIR_FLAGS)
        except OSError:
            raise missing from None
        try:
            for part in parts[:-1]:
                child = os.open(part, _DIR_FLAGS, dir_fd=directory)
                os.close(directory)
                directory = child
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=directory)
        except OSError:
            raise missing from None
        finally:
            os.close(directory)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise missing
        return fd, info


class _Chunks:
    """The file's first `size` bytes (what it held when it was opened), chunk by chunk; the
    file is closed at the end, or by `aclose` (whether or not it was read)."""

    def __init__(self, fd: int, size: int, chunk_bytes: int) -> None:
        self.fd: int | None = fd
        self.left = size
        self.chunk_bytes = chunk_bytes

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        fd = self.fd
        if fd is not None and self.left > 0:
            chunk = await asyncio.to_thread(os.read, fd, min(self.chunk_bytes, self.left))
            if chunk:
                self.left -= len(chunk)
                return chunk
        await self.aclose()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
