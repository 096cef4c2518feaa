"""Uploaded files: stored with their size, SHA-256 and MIME type, referenced by queries.

`{dir}/{id}/content` holds the bytes and `{dir}/{id}/meta.json` the description;
ids are `f_` + 16 hex. The MIME type is sniffed from the content's magic bytes,
then the file name, then the client's claim.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import mimetypes
import re
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

from service.core.commands import ANONYMOUS, Principal
from service.core.errors import InvalidRequest, NotFound, PayloadTooLarge
from service.core.ids import shorten

_ID = re.compile(r"^f_[0-9a-f]{16}$")
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
    (b"PK\x03\x04", "application/zip"),
)


@dataclass(frozen=True, slots=True)
class StoredUpload:
    id: str
    name: str
    type: str  # "image" or "file"
    mime_type: str
    size_bytes: int
    sha256: str
    chat_id: str
    owner: dict[str, str] | None = None  # {"tenant", "subject"}; None: anonymous


def sniff_mime(content: bytes, name: str, claimed: str) -> str:
    for magic, mime in _MAGIC:
        if content.startswith(magic):
            return mime
    if content[:4] == b"RIFF" and content[8:12] == b"WEBP":
        return "image/webp"
    guessed, _ = mimetypes.guess_type(name)
    return guessed or claimed or "application/octet-stream"


class UploadStore:
    """Stores uploads under a directory, with a size limit."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes

    async def save(
        self,
        name: str,
        content: bytes,
        claimed_mime: str,
        chat_id: str,
        *,
        owner: Principal = ANONYMOUS,
    ) -> StoredUpload:
        if not name or "/" in name or "\\" in name or name in (".", ".."):
            raise InvalidRequest("upload needs a plain file name (no path)")
        if len(content) > self.max_bytes:
            raise PayloadTooLarge(
                f"upload of {len(content)} bytes exceeds the limit of {self.max_bytes} bytes",
                limit=str(self.max_bytes),
            )
        mime = sniff_mime(content, name, claimed_mime)
        upload = StoredUpload(
            id="f_" + secrets.token_hex(8),
            name=name,
            type="image" if mime.startswith("image/") else "file",
            mime_type=mime,
            size_bytes=len(content),
            sha256=hashlib.sha256(content).hexdigest(),
            chat_id=chat_id,
            owner=None if owner.anonymous else owner.to_record(),
        )
        await asyncio.to_thread(self._write, upload, content)
        return upload

    def _write(self, upload: StoredUpload, content: bytes) -> None:
        """The content, then its description, renamed into place: another process of the
        host (a worker sharing the directory) sees a whole upload or none."""
        folder = self.directory / upload.id
        folder.mkdir(parents=True)
        (folder / "content").write_bytes(content)
        partial = folder / "meta.json.partial"
        partial.write_text(json.dumps(asdict(upload), ensure_ascii=False))
        partial.replace(folder / "meta.json")

    async def get(self, upload_id: str, owner: Principal = ANONYMOUS) -> tuple[StoredUpload, bytes]:
        """The upload and its content; another principal's upload is not found."""
        if not _ID.match(upload_id):
            shown = shorten(upload_id)
            raise NotFound(f"no upload {shown!r}", upload_id=shown)
        folder = self.directory / upload_id
        try:
            meta, content = await asyncio.to_thread(
                lambda: ((folder / "meta.json").read_text(), (folder / "content").read_bytes())
            )
        except FileNotFoundError:
            raise NotFound(f"no upload {upload_id!r}", upload_id=upload_id) from None
        upload = StoredUpload(**json.loads(meta))
        if Principal.from_record(upload.owner) != owner:
            raise NotFound(f"no upload {upload_id!r}", upload_id=upload_id)
        return upload, content

    async def content_parts(
        self,
        upload_id: str,
        *,
        image_input: bool,
        inline_text_bytes: int,
        owner: Principal = ANONYMOUS,
    ) -> list[dict[str, object]]:
        """The user-message parts that carry an upload to a model."""
        upload, content = await self.get(upload_id, owner)
        if upload.type == "image" and image_input:
            data = base64.b64encode(content).decode()
            url = f"data:{upload.mime_type};base64,{data}"
            return [{"type": "image_url", "image_url": {"url": url}}]
        if upload.mime_type.startswith("text/") or upload.mime_type == "application/json":
            text = content[:inline_text_bytes].decode("utf-8", errors="replace")
            cut = " (truncated)" if len(content) > inline_text_bytes else ""
            return [{"type": "text", "text": f"[file {upload.name}{cut}]\n{text}"}]
        note = f"[attached {upload.type} {upload.name}: {upload.mime_type}, {upload.size_bytes} B]"
        return [{"type": "text", "text": note}]
