-- Quota counters per account x resource x period. The period (YYYY-MM in the platform zone)
-- is part of the key, so flows start again at zero each month without any job running;
-- a stock's level is the sum of its deltas over all periods.
CREATE SCHEMA IF NOT EXISTS quota;

-- One row per account: its current plan quotas (NULL = never changed plan: the free tier),
-- and the row every writer locks first, so the states of one account are computed in turn.
CREATE TABLE quota.accounts (
    account_id  uuid PRIMARY KEY,
    plan        text,
    quotas      jsonb,
    plan_time   timestamptz
);

CREATE TABLE quota.counters (
    account_id       uuid   NOT NULL,
    resource         text   NOT NULL,
    period           text   NOT NULL,
    used             bigint NOT NULL DEFAULT 0,
    -- the latest event time counted: the watermark published as the state's time
    last_event_time  timestamptz NOT NULL,
    PRIMARY KEY (account_id, resource, period)
);

CREATE TABLE quota.packages (
    order_id    uuid PRIMARY KEY,
    account_id  uuid   NOT NULL,
    resource    text   NOT NULL,
    period      text   NOT NULL,
    amount      bigint NOT NULL
);
CREATE INDEX packages_by_account ON quota.packages (account_id, period);

-- The highest whole percent announced on quota-thresholds.v1 per account x resource x period.
CREATE TABLE quota.threshold_marks (
    account_id  uuid     NOT NULL,
    resource    text     NOT NULL,
    period      text     NOT NULL,
    pct         smallint NOT NULL,
    PRIMARY KEY (account_id, resource, period)
);

-- Event ids already counted (idempotency), written in the same transaction as the counters.
CREATE TABLE quota.processed_events (
    event_id      uuid PRIMARY KEY,
    processed_at  timestamptz NOT NULL DEFAULT now()
);
