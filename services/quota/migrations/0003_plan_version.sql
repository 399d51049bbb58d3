-- billing.v1 `plan_changed`'s `version`: the newest plan is the one with the highest version,
-- then (equal versions: events from before versions, 0) the latest time (contracts/events.py, order_of).
ALTER TABLE quota.accounts ADD COLUMN plan_version bigint NOT NULL DEFAULT 0;
