-- A renewal declined with no grace earned (docs/api.md, "Renewals": the account had no paid renewal
-- of this plan or a dearer one for the period before) puts the account on free at once; this is
-- when. The job never tries it again (next_attempt_at NULL); it stays `pending`, and paying it in
-- the console during its period puts its plan back.
ALTER TABLE billing.orders ADD COLUMN plan_dropped_at timestamptz;
