"""Uploaded files: described by size, SHA-256 and MIME type, referenced by queries.

`Uploads` is what the front door calls: it checks the name and the size limit,
sniffs the MIME type (the content's magic bytes, then the file name, then the
client's claim), gives the upload its id (`f_` + 16 hex) and its owner, and hides
another principal's upload. Where the description and the bytes are kept is an
`UploadStore` (`service.core.ports`): a directory, memory, or PostgreSQL, shared
by replicas (`service/state/`).
"""

from __future__ import annotations

import base64
import hashlib
import mimetypes
import re
import secrets
from typing import TYPE_CHECKING

from service.core.errors import InvalidRequest, NotFound, PayloadTooLarge
from service.core.ids import ANONYMOUS, Principal, shorten
from service.core.values import StoredUpload

if TYPE_CHECKING:
    from service.core.ports import UploadStore

_ID = re.compile(r"^f_[0-9a-f]{16}$")
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
    (b"PK\x03\x04", "application/zip"),
)


def valid_upload_id(upload_id: str) -> bool:
    """Whether `upload_id` is one this service could have given (`f_` + 16 hex)."""
    return _ID.match(upload_id) is not None


def sniff_mime(content: bytes, name: str, claimed: str) -> str:
    for magic, mime in _MAGIC:
        if content.startswith(magic):
            return mime
    if content[:4] == b"RIFF" and content[8:12] == b"WEBP":
        return "image/webp"
    guessed, _ = mimetypes.guess_type(name)
    return guessed or claimed or "application/octet-stream"


class Uploads:
    """Stores uploads in an `UploadStore`, with a size limit, and finds them for their owner."""

    def __init__(self, store: UploadStore, max_bytes: int) -> None:
        self.store = store
        self.max_bytes = max_bytes

    async def open(self) -> None:
        await self.store.open()

    async def close(self) -> None:
        await self.store.close()

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
        await self.store.put(upload, content)
        return upload

    async def get(self, upload_id: str, owner: Principal = ANONYMOUS) -> tuple[StoredUpload, bytes]:
        """The upload and its content; another principal's upload is not found."""
        if not valid_upload_id(upload_id):
            shown = shorten(upload_id)
            raise NotFound(f"no upload {shown!r}", upload_id=shown)
        found = await self.store.get(upload_id)
        if found is None or Principal.from_record(found[0].owner) != owner:
            raise NotFound(f"no upload {upload_id!r}", upload_id=upload_id)
        return found

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
