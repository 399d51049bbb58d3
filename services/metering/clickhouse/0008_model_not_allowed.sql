-- (v4) A usage event whose key does not allow its model (the key's allowed_models, from keys.v1)
-- is still stored and counted (it was served) and flagged here, for the activity log. The sink
-- judges it when it writes the event, so past usage keeps the judgment of the rules in force when
-- it was served: a later change of the key's allowed_models neither flags nor clears old rows.
-- Rows written before this migration read 0 (not judged). A skip index lets the activity log read
-- the few flagged rows of an account without reading all of its usage (256-row granules).
-- (No semicolon inside a comment: the migration runner splits statements on it.)
ALTER TABLE {db}.usage_events ADD COLUMN IF NOT EXISTS model_not_allowed UInt8 DEFAULT 0 AFTER api_key_id;
ALTER TABLE {db}.usage_events ADD INDEX IF NOT EXISTS model_not_allowed_idx model_not_allowed TYPE minmax GRANULARITY 1;
ALTER TABLE {db}.usage_events MATERIALIZE INDEX model_not_allowed_idx SETTINGS mutations_sync = 1
