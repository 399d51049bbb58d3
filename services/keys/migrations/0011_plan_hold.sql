-- The one place where billing's plan and keys' user type meet (API.md: an individual user never
-- holds the enterprise tier). Keys owns the user type, billing the plan, and each used to judge
-- the other's fact by its own copy of it (a consumer behind): a user-type change and a payment
-- at the same instant both passed. Billing now takes the account's keys row lock in its plan
-- transactions through these two functions (keys' interface: its table stays its own), so the
-- two writes serialise on this row: billing judges by the user type of record, and the plan it
-- puts in force is in this row, where keys' PUT /api/account/user-type judges, before the lock
-- is let go.

-- The account's user type, its row locked until the caller's transaction ends (NULL: no account).
CREATE FUNCTION keys.lock_user_type(uuid) RETURNS text LANGUAGE sql AS $$
    SELECT user_type FROM keys.accounts WHERE id = $1 FOR UPDATE
$$;

-- billing.v1 `plan_changed` applied ahead of keys' consumer, under the same rule it applies it
-- with (newest version, then time, wins: a later delivery of the event changes nothing).
CREATE FUNCTION keys.record_plan(uuid, text, timestamptz, bigint) RETURNS void LANGUAGE sql AS $$
    UPDATE keys.accounts SET plan = $2, plan_time = $3, plan_version = $4
     WHERE id = $1 AND (plan_time IS NULL OR (plan_version, plan_time) < ($4, $3))
$$;
