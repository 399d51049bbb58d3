-- (v2) The rotation reminder: the age of every API key (from keys.v1), and in-site notifications
-- of a second kind. The partial unique index is the "once per key, ever" of the reminder: replicas
-- and replays that post it again insert nothing.
CREATE TABLE alerts.keys (
    key_id      uuid PRIMARY KEY,
    account_id  uuid        NOT NULL,
    created_at  timestamptz,
    created_by  uuid,
    masked_key  text,
    deleted     boolean     NOT NULL DEFAULT false,
    time        timestamptz NOT NULL
);
CREATE INDEX keys_by_age ON alerts.keys (created_at) WHERE NOT deleted;

ALTER TABLE alerts.notifications ALTER COLUMN delivery_id DROP NOT NULL;
ALTER TABLE alerts.notifications ALTER COLUMN metric DROP NOT NULL;
ALTER TABLE alerts.notifications ALTER COLUMN threshold_pct DROP NOT NULL;
ALTER TABLE alerts.notifications ADD COLUMN kind text NOT NULL DEFAULT 'quota_threshold'
    CHECK (kind IN ('quota_threshold', 'key_rotation_due'));
ALTER TABLE alerts.notifications ADD COLUMN api_key_id uuid;
ALTER TABLE alerts.notifications ADD COLUMN created_by uuid;
CREATE UNIQUE INDEX notifications_rotation_once ON alerts.notifications (api_key_id) WHERE kind = 'key_rotation_due';
