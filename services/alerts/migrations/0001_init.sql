-- The alerts service's own schema: rules, the latest quota state it has seen, firings,
-- per-channel/recipient deliveries, and in-site notifications.
CREATE SCHEMA IF NOT EXISTS alerts;

CREATE TABLE alerts.rules (
    id            uuid PRIMARY KEY,
    account_id    uuid        NOT NULL,
    metric        text        NOT NULL,
    resource      text        NOT NULL,
    threshold_pct integer     NOT NULL CHECK (threshold_pct BETWEEN 1 AND 100),
    channels      text[]      NOT NULL,
    recipients    jsonb       NOT NULL DEFAULT '[]'::jsonb,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rules_account_resource ON alerts.rules (account_id, resource, threshold_pct);

-- Latest quota.v1 state per account and resource, so a new rule can tell whether its
-- threshold is already passed this period.
CREATE TABLE alerts.quota_states (
    account_id uuid        NOT NULL,
    resource   text        NOT NULL,
    period     text        NOT NULL,
    total      bigint      NOT NULL,
    used       bigint      NOT NULL,
    time       timestamptz NOT NULL,
    PRIMARY KEY (account_id, resource)
);

-- One row per (rule, threshold, period): the unique constraint is what makes firing exactly once
-- under redelivery and competing consumers.
CREATE TABLE alerts.firings (
    id            uuid PRIMARY KEY,
    rule_id       uuid        NOT NULL REFERENCES alerts.rules (id) ON DELETE CASCADE,
    account_id    uuid        NOT NULL,
    metric        text        NOT NULL,
    threshold_pct integer     NOT NULL,
    period        text        NOT NULL,
    used          bigint      NOT NULL,
    total         bigint      NOT NULL,
    cause         text        NOT NULL CHECK (cause IN ('crossing', 'creation')),
    event_id      uuid,
    fired_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT firings_once UNIQUE (rule_id, threshold_pct, period)
);
CREATE INDEX firings_account ON alerts.firings (account_id, period);

-- One message per firing, channel and recipient. Written with the firing in one transaction;
-- a sender holds the row lock while it sends, so a crashed sender frees it at once.
CREATE TABLE alerts.deliveries (
    id          uuid PRIMARY KEY,
    firing_id   uuid        NOT NULL REFERENCES alerts.firings (id) ON DELETE CASCADE,
    channel     text        NOT NULL CHECK (channel IN ('in_site', 'email', 'sms')),
    recipient   text        NOT NULL,
    status      text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'sent', 'failed')),
    attempts    integer     NOT NULL DEFAULT 0,
    last_error  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    sent_at     timestamptz,
    CONSTRAINT deliveries_once UNIQUE (firing_id, channel, recipient)
);
CREATE INDEX deliveries_pending ON alerts.deliveries (created_at) WHERE status = 'pending';

-- In-site messages; delivery_id is unique so the in-site channel can never store one twice.
CREATE TABLE alerts.notifications (
    id            uuid PRIMARY KEY,
    delivery_id   uuid        NOT NULL UNIQUE,
    account_id    uuid        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    title         text        NOT NULL,
    message       text        NOT NULL,
    metric        text        NOT NULL,
    threshold_pct integer     NOT NULL,
    links         jsonb       NOT NULL,
    read_at       timestamptz
);
CREATE INDEX notifications_account ON alerts.notifications (account_id, created_at DESC);
