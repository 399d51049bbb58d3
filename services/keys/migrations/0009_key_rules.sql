-- (v4) A key's own rules (contracts/key_limits.py KeyRules: limits, allowed models, routes and
-- addresses, its rate limit) as the JSON keys.v1 carries them. One document, not columns: the
-- rules are always read, written and published whole, and validated by the contract's model.
-- '{}' (every rule absent) allows everything, as keys from before v4 always did.
ALTER TABLE keys.api_keys ADD COLUMN rules jsonb NOT NULL DEFAULT '{}';
