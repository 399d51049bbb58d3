-- The users of each account (members, v2), from users.v1: a rule's `{user_id}` recipient must be a
-- live user of the rule's account. A removal is final (`removed` never goes back to false), so a
-- replayed or late older state cannot bring a removed member back.
CREATE TABLE alerts.users (
    user_id    uuid PRIMARY KEY,
    account_id uuid        NOT NULL,
    removed    boolean     NOT NULL DEFAULT false,
    time       timestamptz NOT NULL
);
