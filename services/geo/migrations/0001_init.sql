-- GEO projects (the example platform resource) and the outbox of its usage.v1 deltas.
CREATE SCHEMA IF NOT EXISTS geo;

CREATE TABLE geo.projects (
    id         uuid PRIMARY KEY,
    account_id uuid NOT NULL,
    name       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX projects_account ON geo.projects (account_id, created_at);

CREATE TABLE geo.outbox (
    seq        bigserial PRIMARY KEY,
    topic      text NOT NULL,
    key        bytea NOT NULL,
    value      bytea,
    created_at timestamptz NOT NULL DEFAULT now(),
    sent_at    timestamptz
);
CREATE INDEX outbox_unsent ON geo.outbox (seq) WHERE sent_at IS NULL;
