-- Renewals (an addition beyond the contract, docs/api.md "Renewals"): at each period's start every
-- account on a paid plan gets one `plan_renewal` order of the plan's full monthly price, charged by
-- the renewal job of every billing replica (services/billing/service.py, `renew_all`).
ALTER TABLE billing.orders DROP CONSTRAINT orders_kind_check;
ALTER TABLE billing.orders ADD CONSTRAINT orders_kind_check CHECK (kind IN ('plan_upgrade', 'quota_package', 'plan_renewal'));
-- A renewal's charge attempts: how many failed, when the job tries again, and when its grace ended
-- unpaid (the account went to free then; a lapsed renewal is never charged again).
ALTER TABLE billing.orders ADD COLUMN attempts integer NOT NULL DEFAULT 0;
ALTER TABLE billing.orders ADD COLUMN next_attempt_at timestamptz;
ALTER TABLE billing.orders ADD COLUMN lapsed_at timestamptz;
-- Exactly one renewal per account and period, whatever number of replicas runs the job at once.
CREATE UNIQUE INDEX orders_one_renewal ON billing.orders (account_id, period) WHERE kind = 'plan_renewal';
-- The job's retries: the pending renewals whose next attempt is due.
CREATE INDEX orders_renewals_due ON billing.orders (next_attempt_at)
    WHERE kind = 'plan_renewal' AND status = 'pending' AND lapsed_at IS NULL;
-- The plan an account held at the start of `start_plan_period`, written by its first plan change
-- in that period (`set_plan`): a renewal charges the plan held at the period's start, even when the
-- job runs after a change in that period (catch-up after downtime). NULL period: no change recorded
-- since this column exists; then a plan changed before the period's start is the plan at its start.
ALTER TABLE billing.accounts ADD COLUMN start_plan text;
ALTER TABLE billing.accounts ADD COLUMN start_plan_period text;
