-- An account's end (docs/backup.md, "Reconciling Kafka": an account Kafka holds deleted stays
-- deleted when a restore brings its row back). The row stays, with the time it was deleted: its
-- audit log, plans and counters name it, and every republish publishes it deleted again (before,
-- a row with no such state was published live by the next refill of accounts.v1). Its e-mail is
-- free again, as a removed member's is (keys.users_email): the address may register anew.
ALTER TABLE keys.accounts ADD COLUMN deleted_at timestamptz;
DROP INDEX keys.accounts_email;
CREATE UNIQUE INDEX accounts_email ON keys.accounts (lower(email)) WHERE deleted_at IS NULL;
