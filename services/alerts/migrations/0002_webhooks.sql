-- (v2) The webhook channel: a signing secret per rule, deliveries retried on a schedule that
-- survives restarts (next_attempt_at), and one row per attempt for the delivery log.
ALTER TABLE alerts.rules ADD COLUMN webhook_secret text;

ALTER TABLE alerts.deliveries DROP CONSTRAINT deliveries_channel_check;
ALTER TABLE alerts.deliveries ADD CONSTRAINT deliveries_channel_check
    CHECK (channel IN ('in_site', 'email', 'sms', 'webhook'));
-- NULL: due now. A webhook delivery that failed waits here until its next attempt.
ALTER TABLE alerts.deliveries ADD COLUMN next_attempt_at timestamptz;

CREATE TABLE alerts.delivery_attempts (
    id              uuid PRIMARY KEY,
    delivery_id     uuid        NOT NULL REFERENCES alerts.deliveries (id) ON DELETE CASCADE,
    attempt         integer     NOT NULL CHECK (attempt >= 1),
    time            timestamptz NOT NULL,
    status_code     integer,
    error           text,
    next_attempt_at timestamptz,
    CONSTRAINT delivery_attempts_once UNIQUE (delivery_id, attempt)
);
