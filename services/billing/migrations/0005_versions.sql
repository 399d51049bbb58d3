-- Versions of the account's facts (contracts/events.py, order_of), so that the newest is the
-- one written last and not the one whose writer's clock ran ahead:
-- plan_version: bumped by every plan change under the account's row lock and published as
--   billing.v1 `plan_changed`'s `version` (0: plans changed before versions existed);
-- user_type_version: the keys service's version of the accounts.v1 / `user_type_changed` fact
--   the user type came from (0 with user_type_time: a fact from before versions; the default).
ALTER TABLE billing.accounts ADD COLUMN plan_version bigint NOT NULL DEFAULT 0;
ALTER TABLE billing.accounts ADD COLUMN user_type_version bigint NOT NULL DEFAULT 0;
