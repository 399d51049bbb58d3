-- (v4) A rule may watch one API key's own limit (scope `{api_key_id}`); null = the account's quota.
-- A key rule's firing is unique on (rule, threshold, window): its `period` holds the limit's window
-- (`2026-11-26`, `2026-W48`, `2026-11` or `once`), so a daily limit may fire again tomorrow. The
-- firing keeps the key and the limit's period for the message (the masked key is read from
-- alerts.keys, the keys.v1 projection, when it is sent).
ALTER TABLE alerts.rules ADD COLUMN api_key_id uuid;
ALTER TABLE alerts.firings ADD COLUMN api_key_id uuid;
ALTER TABLE alerts.firings ADD COLUMN limit_period text
    CHECK (limit_period IN ('day', 'week', 'month', 'once'));
