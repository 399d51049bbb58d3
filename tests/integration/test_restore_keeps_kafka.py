"""`tollgate restore` to an older point leaves Kafka as it was (docs/backup.md), and the owners
refill only what Kafka lacks. A key made after the backup is not in the restored Postgres, but
its state is still in keys.v1: every edge rebuilds its projection from there and goes on
admitting the key, which the console no longer lists and cannot delete (404), and `tollgate
republish` re-emits only the keys Postgres holds. Simulated here without the local stack: the
restore's effect on the keys service is the key's row gone from keys.api_keys."""

import psycopg
import pytest

from services.runtime.host.republish import republish
from tests.integration.test_keys_api import bearer, new_key, signup
from tests.support.apps import running_app

pytestmark = pytest.mark.integration


@pytest.mark.xfail(
    strict=True,
    reason="restore keeps Kafka's compacted topics: a credential made after the backup stays in keys.v1 and the "
    "edges admit it; nothing tombstones states Postgres no longer holds (found by review)",
)
async def test_a_key_made_after_the_backup_is_refused_once_the_backup_is_restored(settings):
    async with running_app(settings) as (_, client):
        _, console = await signup(client)
        kept = await new_key(client, console, name="in the backup")
        later = await new_key(client, console, name="made after the backup")
        assert (await client.get("/api/geo/projects", headers=bearer(later["key"]))).status_code == 200

    # the restore (Tollgate stopped): Postgres as the backup had it, Kafka left as it was
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM keys.api_keys WHERE id = %s", (later["id"],))
    await republish(settings)  # what docs/backup.md offers to rebuild the topics from Postgres

    async with running_app(settings) as (_, client):
        listed = (await client.get("/api/api-keys", headers=console)).json()["items"]
        assert [k["id"] for k in listed] == [kept["id"]]
        assert (await client.delete(f"/api/api-keys/{later['id']}", headers=console)).status_code == 404
        refused = await client.get("/api/geo/projects", headers=bearer(later["key"]))
        assert refused.status_code == 401, refused.text  # today: 200, the ghost key is admitted
