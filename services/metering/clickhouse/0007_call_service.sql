-- (v3) The platform service that verified a call (its service token's name, through verify or
-- authorize): '' on Tollgate's own routes (LowCardinality: a few services). The analysts' view
-- gains it (null when '').
ALTER TABLE {db}.call_events ADD COLUMN IF NOT EXISTS service LowCardinality(String) DEFAULT '' AFTER count;
CREATE OR REPLACE VIEW {db}.api_calls AS
SELECT
    id AS event_id,
    time AS event_time,
    ingested_at,
    account_id,
    api_key_id,
    method,
    path AS route,
    status,
    ip,
    user_agent,
    latency_ms,
    nullIf(error_code, '') AS error_code,
    count,
    nullIf(service, '') AS service
FROM {db}.call_events
