-- The journals of the runs in flight (service/core/run/journal.py), so that another
-- replica resumes a run whose owner was lost: what it started with, its events, its
-- steps' results. A run's rows are deleted once its log is kept in run_logs.
CREATE TABLE journal_runs (
  run_id TEXT PRIMARY KEY,
  chat_id TEXT NOT NULL,
  record JSONB NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  begun_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE journal_events (
  run_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  event BYTEA NOT NULL,
  PRIMARY KEY (run_id, seq)
);

CREATE TABLE journal_steps (
  run_id TEXT NOT NULL,
  key TEXT NOT NULL,
  position BIGSERIAL,
  result JSONB,
  PRIMARY KEY (run_id, key)
);
