-- (No semicolon inside a comment: apply_migrations splits the file on them.)
-- Analytics at 100M events (issue 17, item 6). The `hourly` projection was stored with the
-- table's 8192-row granules. A part's projection holds a few thousand rows per account, so one
-- granule spanned many accounts and an account's read decompressed every account's rollup rows
-- of every part (69k rows for a 1,440-row answer at 10M events). With 256-row granules the
-- projection's primary key finds the account's own rows. The projection is rebuilt in the
-- existing parts by a synchronous mutation (until it ends, reads fall back to the raw rows:
-- slower, never wrong), with the same definition as 0004's.
ALTER TABLE {db}.usage_events DROP PROJECTION IF EXISTS hourly;
ALTER TABLE {db}.usage_events ADD PROJECTION IF NOT EXISTS hourly
(
    SELECT account_id, toStartOfHour(time), resource, provider, model, api_key_id,
           count(), sum(quantity), sum(input_tokens), sum(output_tokens), sum(total_tokens), max(time)
    GROUP BY account_id, toStartOfHour(time), resource, provider, model, api_key_id
) WITH SETTINGS (index_granularity = 256);
ALTER TABLE {db}.usage_events MATERIALIZE PROJECTION hourly SETTINGS mutations_sync = 1
