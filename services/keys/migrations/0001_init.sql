-- Accounts, API keys (SHA-256 hash only, never the secret) and the outbox of keys.v1,
-- accounts.v1 and billing.v1 events, written in the same transaction as the change.
CREATE SCHEMA IF NOT EXISTS keys;

CREATE TABLE keys.accounts (
    id            uuid PRIMARY KEY,
    email         text NOT NULL,
    password_hash text NOT NULL,
    name          text NOT NULL,
    user_type     text NOT NULL,
    roles         text[] NOT NULL,
    plan          text NOT NULL DEFAULT 'free',
    plan_time     timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX accounts_email ON keys.accounts (lower(email));

CREATE TABLE keys.api_keys (
    id           uuid PRIMARY KEY,
    account_id   uuid NOT NULL REFERENCES keys.accounts (id),
    name         text NOT NULL,
    hash         char(64) NOT NULL UNIQUE,
    masked_key   text NOT NULL,
    status       text NOT NULL,
    expires_at   timestamptz,
    -- a rotated key is deleted for good at this instant (end of its grace period)
    delete_at    timestamptz,
    deleted_at   timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz
);
CREATE INDEX api_keys_account ON keys.api_keys (account_id, created_at) WHERE deleted_at IS NULL;
CREATE INDEX api_keys_delete_at ON keys.api_keys (delete_at) WHERE deleted_at IS NULL AND delete_at IS NOT NULL;

CREATE TABLE keys.outbox (
    seq        bigserial PRIMARY KEY,
    topic      text NOT NULL,      -- base topic name (without the deployment prefix)
    key        bytea NOT NULL,
    value      bytea,              -- NULL is a tombstone
    created_at timestamptz NOT NULL DEFAULT now(),
    sent_at    timestamptz
);
CREATE INDEX outbox_unsent ON keys.outbox (seq) WHERE sent_at IS NULL;
