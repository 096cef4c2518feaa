-- The spend ledger (README "Quotas and spend"): what model calls used, by UTC day, tenant,
-- API key, agent and model. Each run adds its calls when it ends.
CREATE TABLE spend_ledger (
    day               date NOT NULL,
    tenant            text COLLATE "C" NOT NULL,
    api_key           text COLLATE "C" NOT NULL,        -- the key's name; '' for a token
    agent_key         text COLLATE "C" NOT NULL,
    model             text COLLATE "C" NOT NULL,
    calls             bigint NOT NULL,
    prompt_tokens     bigint NOT NULL,
    completion_tokens bigint NOT NULL,
    cost              double precision NOT NULL,       -- in the price table's currency
    PRIMARY KEY (tenant, day, api_key, agent_key, model)
);
CREATE INDEX spend_ledger_by_day ON spend_ledger (day);
