-- transactional: false
-- Metering deletes the ids older than USAGE_IDEMPOTENCY_WINDOW_SECONDS, oldest first, in chunks
-- (services/metering/retention.py): this index finds them without reading the whole table.
-- CONCURRENTLY (outside a transaction) so ingestion goes on while a grown table is indexed;
-- a build interrupted before yoyo recorded this migration leaves an invalid index, dropped on the rerun.
DROP INDEX CONCURRENTLY IF EXISTS metering.ingested_events_received_at;
CREATE INDEX CONCURRENTLY ingested_events_received_at ON metering.ingested_events (received_at);
