-- The agent store (README "Agents in the database"): every version of every agent written
-- through CreateAgent, UpdateAgent and RollbackAgent (or seeded from the agents directory),
-- never changed or removed; the newest version of a key is the one served. `definition` is
-- the agent file's JSON as given (`json`: it reads back as written).
CREATE TABLE agent_versions (
    agent_key      text COLLATE "C" NOT NULL,
    version        integer NOT NULL,
    definition     json NOT NULL,
    created_at     bigint NOT NULL,               -- ms since the epoch
    created_by     text NOT NULL,                 -- tenant/subject of the caller
    change         text NOT NULL CHECK (change IN ('created', 'updated', 'rolled_back', 'seeded')),
    source_version integer NOT NULL DEFAULT 0,    -- a rollback: the version it restored
    comment        text NOT NULL DEFAULT '',
    PRIMARY KEY (agent_key, version)
);
