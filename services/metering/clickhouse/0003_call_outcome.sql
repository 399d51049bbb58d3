-- (v2) Refused calls are logged too. `error_code` is the contract's code of a refused call (401 of
-- a known key, 403, 429) and '' on an admitted one (LowCardinality: a few dozen codes). `count` is
-- how many refused calls the edge folded into this one event (1 unless its refused lane was full).
-- Rows written before this migration read as admitted single calls, which is what they were.
-- (No semicolon inside a comment: the migration runner splits statements on it.)
ALTER TABLE {db}.call_events ADD COLUMN IF NOT EXISTS error_code LowCardinality(String) DEFAULT '' AFTER latency_ms;
ALTER TABLE {db}.call_events ADD COLUMN IF NOT EXISTS count UInt32 DEFAULT 1 AFTER error_code
