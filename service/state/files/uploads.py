"""The file `UploadStore`: one directory per upload, under the uploads directory.

`{dir}/{id}/content` holds the bytes and `{dir}/{id}/meta.json` the description.
An upload that cannot be written whole (a full disk) is removed and refused with
`StoreFailed`.
For one process, or for replicas that share the directory (a network file system
mounted on every host); replicas on separate disks want the PostgreSQL store.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from dataclasses import asdict
from pathlib import Path

from service.core.errors import StoreFailed
from service.core.values import StoredUpload


class FileUploadStore:
    """Uploads under a directory (`AGW_UPLOAD_STORE=files`, the default)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def put(self, upload: StoredUpload, content: bytes) -> None:
        await asyncio.to_thread(self._write, upload, content)

    def _write(self, upload: StoredUpload, content: bytes) -> None:
        folder = self.directory / upload.id
        try:
            folder.mkdir(parents=True)
        except OSError as error:
            raise StoreFailed(f"could not store upload {upload.id!r}: {error}") from error
        try:
            (folder / "content").write_bytes(content)
            # The description last, renamed into place: an upload without one is not found
            # (a write cut short), and another process sharing the directory (a worker)
            # reads a whole description or none.
            partial = folder / "meta.json.partial"
            partial.write_text(json.dumps(asdict(upload), ensure_ascii=False))
            partial.replace(folder / "meta.json")
        except OSError as error:  # a full disk, above all: nothing of it is kept
            shutil.rmtree(folder, ignore_errors=True)
            raise StoreFailed(f"could not store upload {upload.id!r}: {error}") from error

    async def get(self, upload_id: str) -> tuple[StoredUpload, bytes] | None:
        folder = self.directory / upload_id
        try:
            meta, content = await asyncio.to_thread(
                lambda: ((folder / "meta.json").read_text(), (folder / "content").read_bytes())
            )
        except FileNotFoundError:
            return None
        return StoredUpload(**json.loads(meta)), content

    async def delete_chat(self, chat_id: str) -> int:
        """Remove the uploads made to the chat: every upload's description is read (the
        directory has no index by chat), in a worker thread."""
        return await asyncio.to_thread(self._delete_chat, chat_id)

    def _delete_chat(self, chat_id: str) -> int:
        removed = 0
        try:
            folders = list(self.directory.iterdir())
        except FileNotFoundError:
            return 0
        for folder in folders:
            try:
                meta = json.loads((folder / "meta.json").read_text())
            except (OSError, ValueError):
                continue  # not an upload, or one being written
            if isinstance(meta, dict) and meta.get("chat_id") == chat_id:
                try:
                    shutil.rmtree(folder)
                except OSError as error:
                    raise StoreFailed(
                        f"could not delete upload {folder.name!r}: {error}"
                    ) from error
                removed += 1
        return removed
