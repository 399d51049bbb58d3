-- (v2) The outbox of the alerts service's audit.v1 entries (rule created, rule deleted), written
-- in the transaction of the change and published by its relay (services/runtime/platform/outbox_relay.py).
CREATE TABLE alerts.outbox (
    seq        bigserial PRIMARY KEY,
    topic      text NOT NULL,      -- base topic name (without the deployment prefix)
    key        bytea NOT NULL,
    value      bytea,
    created_at timestamptz NOT NULL DEFAULT now(),
    sent_at    timestamptz
);
CREATE INDEX outbox_unsent ON alerts.outbox (seq) WHERE sent_at IS NULL;
CREATE INDEX outbox_sent ON alerts.outbox (sent_at) WHERE sent_at IS NOT NULL;
