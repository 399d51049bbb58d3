-- transactional: false
-- The outbox relay deletes sent rows past OUTBOX_RETENTION_SECONDS, oldest first, in chunks
-- (services/runtime/platform/pruner.py): this index finds them without reading the whole table.
-- CONCURRENTLY (outside a transaction) so the table's writers go on while a grown table is indexed;
-- a build interrupted before yoyo recorded this migration leaves an invalid index, dropped on the rerun.
DROP INDEX CONCURRENTLY IF EXISTS geo.outbox_sent;
CREATE INDEX CONCURRENTLY outbox_sent ON geo.outbox (sent_at) WHERE sent_at IS NOT NULL;
