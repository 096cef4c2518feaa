-- Uploaded files, shared by replicas: an upload made through one replica is referenced by a
-- query on any other. The description is in columns, the bytes in `content` (bytea; uploads
-- are bounded by AGW_UPLOAD_MAX_BYTES, 10 MiB by default, far below bytea's 1 GiB).
-- Applied once, in one transaction, by service/state/pg_schema.py.
CREATE TABLE uploads (
    id            text COLLATE "C" PRIMARY KEY,   -- f_ + 16 hex
    owner_tenant  text NOT NULL DEFAULT '',
    owner_subject text NOT NULL DEFAULT '',       -- both empty: uploaded with no principal
    chat_id       text NOT NULL DEFAULT '',
    name          text NOT NULL,
    type          text NOT NULL,                  -- "image" or "file"
    mime_type     text NOT NULL,
    size_bytes    bigint NOT NULL,
    sha256        text NOT NULL,
    content       bytea NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX uploads_by_chat ON uploads (chat_id) WHERE chat_id <> '';
