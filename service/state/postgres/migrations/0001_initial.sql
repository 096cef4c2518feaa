-- The system of record of agw on PostgreSQL: chats and their records, the event logs of
-- ended runs, and the run registry and mailbox that let replicas share live runs.
-- Applied once, in one transaction, by service/state/pg_schema.py.

-- Chats: the summary ListChats shows, kept beside the records. `record_count` is the
-- position the chat's next record takes. Ids compare byte by byte (COLLATE "C"), as
-- everywhere else in agw.
CREATE TABLE chats (
    id            text COLLATE "C" PRIMARY KEY,
    owner_tenant  text NOT NULL DEFAULT '',
    owner_subject text NOT NULL DEFAULT '',
    name          text NOT NULL,
    agent_key     text NOT NULL,
    created_at    bigint NOT NULL,          -- ms since the epoch, of the chat's first record
    updated_at    bigint NOT NULL,          -- ms since the epoch, of its latest record
    run_count     integer NOT NULL DEFAULT 0,
    record_count  integer NOT NULL DEFAULT 0
);
CREATE INDEX chats_by_owner ON chats (owner_tenant, owner_subject, updated_at DESC, id);

-- A chat's records in order. `json`, not `jsonb`: a record reads back exactly as it was
-- appended (key order, number spelling, and \u0000, which jsonb refuses); nothing is
-- queried inside a record.
CREATE TABLE chat_records (
    chat_id  text COLLATE "C" NOT NULL REFERENCES chats (id) ON DELETE CASCADE,
    position integer NOT NULL,
    record   json NOT NULL,
    PRIMARY KEY (chat_id, position)
);

-- The complete event logs of ended runs: length-delimited agw.v1.Event messages, as the
-- file run log writes them. Rows past `expires_at` are never read, and pruned.
CREATE TABLE run_logs (
    run_id     text PRIMARY KEY,
    chat_id    text NOT NULL,
    events     bytea NOT NULL,
    saved_at   timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX run_logs_by_expiry ON run_logs (expires_at);

-- The run registry: which replica owns each live run, until when (its lease), and under
-- which fence token. Every claim takes a new token from `run_fences`, so a token only
-- grows: a replica that lost its lease holds a smaller one, and its writes are refused.
-- At most one run of a chat is running.
CREATE SEQUENCE run_fences AS bigint;
CREATE TABLE runs (
    run_id           text PRIMARY KEY,
    chat_id          text NOT NULL,
    owner_tenant     text NOT NULL DEFAULT '',
    owner_subject    text NOT NULL DEFAULT '',
    replica_id       text NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    fence            bigint NOT NULL,
    status           text NOT NULL DEFAULT 'running'
                     CHECK (status IN ('running', 'ended', 'lost')),
    terminal         bytea,                 -- the run's terminal agw.v1.Event, once ended
    created_at       timestamptz NOT NULL DEFAULT now(),
    ended_at         timestamptz
);
CREATE UNIQUE INDEX runs_running_per_chat ON runs (chat_id) WHERE status = 'running';
CREATE INDEX runs_by_lease ON runs (lease_expires_at) WHERE status = 'running';

-- The durable mailbox of live runs: a Submit or a Cancel from any replica waits here until
-- the run's owner takes it (`delivered_at`), then carries the owner's answer.
CREATE TABLE mailbox (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id       text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    kind         text NOT NULL CHECK (kind IN ('submit', 'cancel')),
    payload      json NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    delivered_at timestamptz,
    answer       json,
    answered_at  timestamptz
);
CREATE INDEX mailbox_undelivered ON mailbox (run_id, id) WHERE delivered_at IS NULL;
