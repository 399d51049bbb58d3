-- (No semicolon inside a comment: apply_migrations splits the file on them.)
-- Usage per API key (issue 19, item 4). Events may name the key that caused them, and events
-- without one store the zero UUID (a plain UUID keeps the projection's key non-nullable).
-- The `hourly` projection is rebuilt with api_key_id in its GROUP BY (after the columns the API
-- filters on first, so an account-hour range still reads a few granules) and with max(time), the
-- newest event of each rollup row (the trend's `as_of`). Existing parts get the new projection
-- by a synchronous mutation, and usage_hourly is replaced by a view with the projection's
-- GROUP BY, so filtered and grouped reads are still served by the projection.
ALTER TABLE {db}.usage_events ADD COLUMN IF NOT EXISTS api_key_id UUID AFTER source;
ALTER TABLE {db}.usage_events DROP PROJECTION IF EXISTS hourly;
ALTER TABLE {db}.usage_events ADD PROJECTION IF NOT EXISTS hourly
(
    SELECT account_id, toStartOfHour(time), resource, provider, model, api_key_id,
           count(), sum(quantity), sum(input_tokens), sum(output_tokens), sum(total_tokens), max(time)
    GROUP BY account_id, toStartOfHour(time), resource, provider, model, api_key_id
);
ALTER TABLE {db}.usage_events MATERIALIZE PROJECTION hourly SETTINGS mutations_sync = 1;
CREATE OR REPLACE VIEW {db}.usage_hourly AS
SELECT
    account_id,
    toStartOfHour(time) AS hour,
    resource,
    provider,
    model,
    api_key_id,
    count() AS events,
    sum(quantity) AS quantity,
    sum(input_tokens) AS input_tokens,
    sum(output_tokens) AS output_tokens,
    sum(total_tokens) AS total_tokens,
    max(time) AS last_time
FROM {db}.usage_events
GROUP BY account_id, hour, resource, provider, model, api_key_id
