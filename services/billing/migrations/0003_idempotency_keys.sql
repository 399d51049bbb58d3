-- Idempotency-Key of order creation and payment (API.md v2): one row per (account, route, key),
-- holding a digest of the request and, once it succeeded, the response. The use case inserts the
-- row in its own transaction, so a concurrent retry waits on the unique key, then finds the
-- committed response (or, if the first rolled back, runs itself).
CREATE TABLE billing.idempotency_keys (
    id          bigserial PRIMARY KEY,   -- the pruner's chunk key
    account_id  uuid NOT NULL,
    route       text NOT NULL,           -- method + route template: a key is scoped per account and route
    key         text NOT NULL,
    fingerprint text NOT NULL,           -- SHA-256 hex of the request (path + canonical body)
    status      integer NOT NULL,
    response    jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (account_id, route, key)
);
CREATE INDEX idempotency_keys_created ON billing.idempotency_keys (created_at);
