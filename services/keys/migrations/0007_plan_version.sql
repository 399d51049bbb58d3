-- billing.v1 `plan_changed`'s `version` (GET /api/account's plan): the newest plan is the one
-- with the highest version, then (equal versions: events from before versions, 0) the latest time.
ALTER TABLE keys.accounts ADD COLUMN plan_version bigint NOT NULL DEFAULT 0;
