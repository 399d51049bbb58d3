-- Each published state of a key, account, user or service token carries its row's `version`
-- (contracts/events.py, order_of): every write that publishes a new state bumps it in its
-- UPDATE, under the row lock, so consumers keep the state Postgres holds whatever the order the
-- writers read their clocks in. Rows from before start at 0 (as their published states, which
-- had no version), new rows at 1.
ALTER TABLE keys.api_keys ADD COLUMN version bigint NOT NULL DEFAULT 0;
ALTER TABLE keys.api_keys ALTER COLUMN version SET DEFAULT 1;
ALTER TABLE keys.accounts ADD COLUMN version bigint NOT NULL DEFAULT 0;
ALTER TABLE keys.accounts ALTER COLUMN version SET DEFAULT 1;
ALTER TABLE keys.users ADD COLUMN version bigint NOT NULL DEFAULT 0;
ALTER TABLE keys.users ALTER COLUMN version SET DEFAULT 1;
ALTER TABLE keys.service_tokens ADD COLUMN version bigint NOT NULL DEFAULT 0;
ALTER TABLE keys.service_tokens ALTER COLUMN version SET DEFAULT 1;
