-- (v4) A key's lineage (keys.v1 KeyState.lineage_id): its own id for a key made by POST, its
-- predecessor's lineage for a key made by rotation. Quota counts a key's own limits per lineage,
-- so a rotated key carries on its predecessor's spending instead of starting again from 0.
-- Every key made before lineages is the start of its own.
ALTER TABLE keys.api_keys ADD COLUMN lineage_id uuid;
UPDATE keys.api_keys SET lineage_id = id;
ALTER TABLE keys.api_keys ALTER COLUMN lineage_id SET NOT NULL;
