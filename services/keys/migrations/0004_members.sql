-- Members (v2): users log in to an account, each with one role. The registering user keeps the
-- account's id as its user id (sessions and users.v1 states issued before this use it).
CREATE TABLE keys.users (
    id                  uuid PRIMARY KEY,
    account_id          uuid NOT NULL REFERENCES keys.accounts (id),
    email               text NOT NULL,
    password_hash       text NOT NULL,
    name                text NOT NULL,
    role                text NOT NULL,
    sessions_not_before timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    removed_at          timestamptz
);
-- an e-mail logs in to one user; a removed user's e-mail may be added again
CREATE UNIQUE INDEX users_email ON keys.users (lower(email)) WHERE removed_at IS NULL;
CREATE INDEX users_account ON keys.users (account_id, created_at) WHERE removed_at IS NULL;

INSERT INTO keys.users (id, account_id, email, password_hash, name, role, sessions_not_before, created_at)
SELECT id, id, email, password_hash, name,
       CASE WHEN 'owner' = ANY (roles) THEN 'owner' ELSE roles[1] END,
       sessions_not_before, created_at
FROM keys.accounts
ON CONFLICT DO NOTHING;

-- the user who created the key (the registering user for the keys from before members)
ALTER TABLE keys.api_keys ADD COLUMN created_by uuid;
UPDATE keys.api_keys SET created_by = account_id WHERE created_by IS NULL;
CREATE INDEX api_keys_created_by ON keys.api_keys (created_by) WHERE deleted_at IS NULL;
