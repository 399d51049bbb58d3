-- (v4) A key's own limits count per lineage (keys.v1 KeyState.lineage: the id of the key its
-- rotations started from, its own id if never rotated), so a key made by rotation carries on its
-- predecessor's spending, and the old key in its grace period and the new one share one counter.
-- Every key and reservation made before lineages is the start of its own: lineage = key id.
ALTER TABLE quota.key_rules ADD COLUMN lineage_id uuid;
UPDATE quota.key_rules SET lineage_id = api_key_id;
ALTER TABLE quota.key_rules ALTER COLUMN lineage_id SET NOT NULL;
CREATE INDEX key_rules_by_lineage ON quota.key_rules (lineage_id);

ALTER TABLE quota.key_counters RENAME COLUMN api_key_id TO lineage_id;

ALTER TABLE quota.reservations ADD COLUMN lineage_id uuid;
UPDATE quota.reservations SET lineage_id = api_key_id WHERE api_key_id IS NOT NULL;
DROP INDEX quota.reservations_by_key;
CREATE INDEX reservations_by_lineage ON quota.reservations (lineage_id, resource) WHERE lineage_id IS NOT NULL;

-- the version of a lineage's last published KeyQuotaState (order_of() on the edge), which was the key's
CREATE TABLE quota.key_lineages (
    lineage_id     uuid   PRIMARY KEY,
    state_version  bigint NOT NULL DEFAULT 0
);
INSERT INTO quota.key_lineages (lineage_id, state_version) SELECT api_key_id, state_version FROM quota.key_rules;
ALTER TABLE quota.key_rules DROP COLUMN state_version;
