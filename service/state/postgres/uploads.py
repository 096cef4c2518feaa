"""The PostgreSQL `UploadStore`: uploads that every replica sharing the database sees.

One row per upload in `uploads` (`migrations/0002_uploads.sql`): its description in
columns and its bytes as `bytea`, written in one statement, so an upload is either
wholly there or absent. The bytes live in the database rather than on a disk of the
replica that took them: replicas on separate hosts need no shared file system, and
the database's backups hold the uploads with the chats that reference them. Uploads
are bounded by `AGW_UPLOAD_MAX_BYTES` (10 MiB by default).
"""

from __future__ import annotations

from typing import Any

from service.core.values import StoredUpload
from service.state.postgres.schema import DEFAULT_TIMEOUT_S, PooledStore

_INSERT = """
INSERT INTO uploads (id, owner_tenant, owner_subject, chat_id, name, type, mime_type,
                     size_bytes, sha256, content)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
"""

_SELECT = """
SELECT id, owner_tenant, owner_subject, chat_id, name, type, mime_type, size_bytes, sha256,
       content
FROM uploads WHERE id = $1
"""


def _upload(row: Any) -> StoredUpload:
    tenant, subject = row["owner_tenant"], row["owner_subject"]
    return StoredUpload(
        id=row["id"],
        name=row["name"],
        type=row["type"],
        mime_type=row["mime_type"],
        size_bytes=row["size_bytes"],
        sha256=row["sha256"],
        chat_id=row["chat_id"],
        owner={"tenant": tenant, "subject": subject} if tenant or subject else None,
    )


class PostgresUploadStore(PooledStore):
    """Uploads in PostgreSQL (`AGW_UPLOAD_STORE=postgres`)."""

    what = "upload store"

    def __init__(
        self, dsn: str, *, pool_size: int = 4, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        super().__init__(dsn, pool_size=pool_size, timeout_s=timeout_s)

    async def put(self, upload: StoredUpload, content: bytes) -> None:
        owner = upload.owner or {}
        async with self.connection(f"could not keep upload {upload.id}") as db:
            await db.execute(
                _INSERT,
                upload.id,
                owner.get("tenant", ""),
                owner.get("subject", ""),
                upload.chat_id,
                upload.name,
                upload.type,
                upload.mime_type,
                upload.size_bytes,
                upload.sha256,
                content,
            )

    async def get(self, upload_id: str) -> tuple[StoredUpload, bytes] | None:
        async with self.connection(f"could not read upload {upload_id}") as db:
            row = await db.fetchrow(_SELECT, upload_id)
        return None if row is None else (_upload(row), bytes(row["content"]))

    async def delete_chat(self, chat_id: str) -> int:
        async with self.connection(f"could not delete the uploads of chat {chat_id!r}") as db:
            status = await db.execute("DELETE FROM uploads WHERE chat_id = $1", chat_id)
        return int(status.split()[-1])
