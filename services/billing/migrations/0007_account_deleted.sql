-- An account accounts.v1 holds deleted (a restore's reconcile ends it: docs/backup.md), as billing's
-- consumer saw it: the renewal job never charges it again, whatever plan its row still names.
ALTER TABLE billing.accounts ADD COLUMN deleted_at timestamptz;
