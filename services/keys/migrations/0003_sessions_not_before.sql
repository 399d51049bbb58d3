-- (v2) Console sessions issued before this instant are refused (a password change sets it to
-- now); republished with the user's state on users.v1. Until members exist, user id = account id.
ALTER TABLE keys.accounts ADD COLUMN sessions_not_before timestamptz;
