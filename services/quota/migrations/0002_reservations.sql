-- Reservations (v2): amounts a platform service may spend before it knows the actual usage (a
-- streamed LLM answer). An open row counts against the quota until a usage event carrying its
-- id settles it, the service releases it, or the sweeper drops it at expires_at. Writers hold
-- the account's row lock (quota.accounts) first, so reserve, settle, release and expiry of one
-- account are serialised with its counting on every replica.
CREATE TABLE quota.reservations (
    id          uuid PRIMARY KEY,
    account_id  uuid        NOT NULL,
    resource    text        NOT NULL,
    amount      bigint      NOT NULL CHECK (amount > 0),
    -- the service token that made it (NULL: made in process); another token's id is a 404
    owner_id    uuid,
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX reservations_by_account ON quota.reservations (account_id, resource);
CREATE INDEX reservations_by_expiry ON quota.reservations (expires_at);
