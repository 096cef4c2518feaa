"""The files a chat's tools write in its workspace, as clients see them: listed, read, announced.

A tool that works in the chat's workspace (`_bash_`) announces each file a call created or
changed (`file.create`, `file.update`, through `ToolCallInfo.files`); `ListFiles` lists the
workspace and `DownloadFile` reads one file of it, for the chat's owner only, up to a size
limit. Where the workspaces are is the business of the tool that writes them: the core
reads them through the `WorkspaceFiles` port (service/builtins/files.py implements it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class FileContent(Protocol):
    """A file's bytes, chunk by chunk; `aclose` releases the file, read or not."""

    def __aiter__(self) -> FileContent: ...

    async def __anext__(self) -> bytes: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class WorkspaceFile:
    """A regular file of a chat's workspace."""

    path: str  # "/"-separated, relative to the workspace
    size_bytes: int
    mime_type: str
    modified_at_ms: int = 0


class WorkspaceFiles(Protocol):
    """The chats' workspaces, read-only. Chat ids reaching it are checked already."""

    async def list(self, chat_id: str) -> list[WorkspaceFile]:
        """The workspace's regular files, by path; none when it does not exist."""
        ...

    async def read(
        self, chat_id: str, path: str, max_bytes: int, chunk_bytes: int
    ) -> tuple[WorkspaceFile, FileContent]:
        """The file and its content in chunks; `NotFound` when there is no such regular
        file (a path leaving the workspace, a link, a directory), `PayloadTooLarge` when it
        is larger than `max_bytes`."""
        ...
