-- Logged-out console sessions (sessions.v1), kept in the keys service's Postgres so that a
-- Kafka that lost them can be given them again (`tollgate republish`, docs/architecture.md,
-- "Kafka is transport"). A logout matters only until its session would have expired anyway
-- (SESSION_TTL_SECONDS after it at most): rows older than sessions.v1's retention are pruned.
CREATE TABLE keys.session_revocations (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- what the pruner deletes by
    user_id    uuid NOT NULL,
    session_id text NOT NULL,
    account_id uuid NOT NULL,
    revoked_at timestamptz NOT NULL,
    UNIQUE (user_id, session_id)
);
CREATE INDEX session_revocations_revoked_at ON keys.session_revocations (revoked_at);
