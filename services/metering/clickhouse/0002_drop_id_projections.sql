-- The sink no longer looks ids up in the id-ordered `by_id` projection: with random UUIDs a
-- batch's lookup read nearly every granule of it, so its cost grew with the table. It now looks
-- them up on the primary key, within the batch's own account-hours (services/metering/store.py).
-- Without the projection every insert and merge is cheaper too.
ALTER TABLE {db}.usage_events DROP PROJECTION IF EXISTS by_id;
ALTER TABLE {db}.call_events DROP PROJECTION IF EXISTS by_id
