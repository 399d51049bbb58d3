-- (v2) The audit log: one row per audit.v1 event (the event id is the row's id, so a redelivered
-- event is stored once). Append-only: the trigger refuses every UPDATE and DELETE.
CREATE TABLE keys.audit_log (
    id                uuid PRIMARY KEY,
    account_id        uuid NOT NULL,
    time              timestamptz NOT NULL,
    actor_user_id     uuid,
    actor_email       text,
    actor_api_key_id  uuid,
    actor_operator    boolean NOT NULL DEFAULT false,
    action            text NOT NULL,
    target_type       text NOT NULL,
    target_id         text NOT NULL,
    ip                text NOT NULL DEFAULT '',
    user_agent        text NOT NULL DEFAULT '',
    details           jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_log_account_time ON keys.audit_log (account_id, time DESC, id DESC);

CREATE FUNCTION keys.audit_log_is_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'keys.audit_log is append-only: % refused', TG_OP;
END $$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON keys.audit_log
    FOR EACH ROW EXECUTE FUNCTION keys.audit_log_is_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON keys.audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION keys.audit_log_is_append_only();
