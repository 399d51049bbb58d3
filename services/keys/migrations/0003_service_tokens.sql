-- (v2) Tokens of the platform's own services (`st-...`): only the SHA-256 hash is stored.
-- A revoked token keeps its row (revoked_at), so the operator's list shows what existed.
CREATE TABLE keys.service_tokens (
    id           uuid PRIMARY KEY,
    name         text NOT NULL,
    hash         char(64) NOT NULL UNIQUE,
    scopes       text[] NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    revoked_at   timestamptz
);
CREATE INDEX service_tokens_created ON keys.service_tokens (created_at, id);
