-- The runs' webhooks and the notifications not yet delivered to them, shared by replicas:
-- a webhook added through one replica is notified of a run that another one executes, and
-- a notification queued by a replica that stops is sent by another. Rows of `webhooks` are
-- forgotten after the run archive's time-to-live; a notification's row is deleted once it
-- is delivered (or its attempts ran out). `next_at` (ms since the epoch) is when it is due;
-- a sender takes due rows with FOR UPDATE SKIP LOCKED and moves them past a lease.
-- Applied once, in one transaction, by service/state/postgres/schema.py.
CREATE TABLE webhooks (
    run_id     text COLLATE "C" NOT NULL,
    webhook_id text COLLATE "C" NOT NULL,
    webhook    jsonb NOT NULL,
    added_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, webhook_id)
);
CREATE INDEX webhooks_by_age ON webhooks (added_at);
CREATE TABLE webhook_deliveries (
    id       text COLLATE "C" PRIMARY KEY,
    webhook  jsonb NOT NULL,
    notice   jsonb NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    next_at  bigint NOT NULL
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_at);
