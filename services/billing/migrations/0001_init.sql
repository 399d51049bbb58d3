-- Billing: one subscription row per account (the row every plan change locks), orders, and
-- the outbox that carries every change to billing.v1 in the same transaction.
CREATE SCHEMA IF NOT EXISTS billing;

CREATE TABLE billing.accounts (
    account_id      uuid PRIMARY KEY,
    plan            text NOT NULL DEFAULT 'free',
    user_type       text NOT NULL DEFAULT 'individual',
    -- time of the accounts.v1 / user_type_changed fact the user type came from (NULL: default)
    user_type_time  timestamptz,
    plan_changed_at timestamptz
);

CREATE TABLE billing.orders (
    id              uuid PRIMARY KEY,
    account_id      uuid NOT NULL,
    kind            text NOT NULL CHECK (kind IN ('plan_upgrade', 'quota_package')),
    status          text NOT NULL CHECK (status IN ('pending', 'paid')),
    amount          numeric(14, 2) NOT NULL CHECK (amount >= 0),
    currency        text NOT NULL,
    plan            text,
    previous_plan   text,
    resource        text,
    quantity        bigint,
    period          text NOT NULL,
    created_at      timestamptz NOT NULL,
    paid_at         timestamptz,
    payment_reference text
);
CREATE INDEX orders_by_account ON billing.orders (account_id, created_at);

CREATE TABLE billing.outbox (
    seq         bigserial PRIMARY KEY,
    topic       text  NOT NULL,
    key         bytea NOT NULL,
    value       bytea,          -- NULL would be a tombstone (billing.v1 has none)
    created_at  timestamptz NOT NULL DEFAULT now(),
    sent_at     timestamptz
);
CREATE INDEX outbox_unsent ON billing.outbox (seq) WHERE sent_at IS NULL;
