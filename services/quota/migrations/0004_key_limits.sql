-- (v4) Limits per API key. keys.v1 tells quota each key's limits (key_rules: the newest state by
-- (rules_version, rules_time), as every keys.v1 projection orders them); usage and calls that
-- carry the key's id count against them in key_counters, one row per key x resource x period x
-- window (day `2026-11-26`, ISO week `2026-W48`, month `2026-11`, or `once`), so a new window
-- starts from 0 without any job and a `once` row never refills. Every writer holds the key's
-- account row lock (quota.accounts) first, as for the account's own counters.
CREATE TABLE quota.key_rules (
    api_key_id     uuid PRIMARY KEY,
    account_id     uuid        NOT NULL,
    limits         jsonb       NOT NULL DEFAULT '[]',
    deleted        boolean     NOT NULL DEFAULT false,
    rules_version  bigint      NOT NULL,
    rules_time     timestamptz NOT NULL,
    -- the version of the key's last published KeyQuotaState (order_of() on the edge)
    state_version  bigint      NOT NULL DEFAULT 0
);
CREATE INDEX key_rules_by_account ON quota.key_rules (account_id);

CREATE TABLE quota.key_counters (
    api_key_id       uuid     NOT NULL,
    resource         text     NOT NULL,
    period           text     NOT NULL,
    time_window      text     NOT NULL,
    used             bigint   NOT NULL DEFAULT 0,
    last_event_time  timestamptz NOT NULL,
    -- the highest whole percent of the limit announced on quota-thresholds.v1 in this window
    pct              smallint NOT NULL DEFAULT 0,
    PRIMARY KEY (api_key_id, resource, period, time_window)
);

-- A reservation made for a key's call holds room in the key's limits too.
ALTER TABLE quota.reservations ADD COLUMN api_key_id uuid;
CREATE INDEX reservations_by_key ON quota.reservations (api_key_id, resource) WHERE api_key_id IS NOT NULL;
