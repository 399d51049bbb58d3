"""`tollgate restore` to an older point leaves Kafka as it was (docs/backup.md): the compacted
topics still hold every credential made after the backup (a key, a member and the member's
session, a service token, a whole account) and states newer than the restored rows (a key
disabled in the backup, enabled after it). Every edge rebuilds from those topics and keeps the
highest version, so before the fix the ghosts were admitted (a key the console no longer listed
and whose DELETE answered 404) and the key enabled after the backup stayed enabled.
`tollgate republish` (which `tollgate restore` runs) now reconciles: the ghosts are ended and the
restored rows republished at versions above Kafka's (services/keys/reconcile.py).

Simulated without the local stack: the "backup" is a copy of the keys tables, the "restore" puts
them back (Tollgate stopped), Kafka is left as it was."""

import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest

from services.runtime.host.republish import republish
from tests.integration.test_keys_api import PASSWORD, bearer, new_key, signup
from tests.support.apps import running_app
from tests.support.metering import wait_until
from tests.support.service_tokens import create_service_token

pytestmark = pytest.mark.integration

TABLES = ("accounts", "users", "api_keys", "service_tokens")  # in the order of their foreign keys


def back_up(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for table in TABLES:
            conn.execute(f"CREATE TABLE public.backup_{table} AS TABLE keys.{table}")


def restore(database_url: str) -> None:
    """Postgres as the backup had it (what `tollgate restore` does to the keys schema)."""
    with psycopg.connect(database_url) as conn:
        for table in reversed(TABLES):
            conn.execute(f"DELETE FROM keys.{table}")
        for table in TABLES:
            conn.execute(f"INSERT INTO keys.{table} SELECT * FROM public.backup_{table}")


async def add_member(client: httpx.AsyncClient, console: dict[str, str], email: str) -> dict[str, str]:
    """A developer of the account, and its console session's headers."""
    body = {"email": email, "name": "Dev", "password": PASSWORD, "role": "developer"}
    created = await client.post("/api/account/members", json=body, headers=console)
    assert created.status_code == 201, created.text
    login = await client.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    assert login.status_code == 200, login.text
    return bearer(login.json()["access_token"])


def usage(account_id: str) -> dict[str, Any]:
    event = {"id": str(uuid.uuid4()), "time": datetime.now(UTC).isoformat(), "account_id": account_id}
    return {"events": [{**event, "resource": "api_calls", "quantity": 1, "source": "restore-test"}]}


async def test_credentials_made_after_the_backup_are_refused_and_the_backups_states_win(settings):
    async with running_app(settings) as (_, client):
        account, console = await signup(client)
        kept = await new_key(client, console, name="in the backup")
        off = await new_key(client, console, name="disabled in the backup")
        assert (await client.post(f"/api/api-keys/{off['id']}/toggle", headers=console)).status_code == 200
        back_up(settings.database_url)

        # after the backup: all of these are in Kafka only, once the restore is done
        later = await new_key(client, console, name="made after the backup")
        assert (await client.post(f"/api/api-keys/{off['id']}/toggle", headers=console)).status_code == 200  # enabled
        member = await add_member(client, console, f"later-{account['id'][:8]}@example.com")
        token = bearer((await create_service_token(client, settings, name="made after the backup"))["token"])
        _, other_console = await signup(client)  # a whole account registered after the backup
        others_key = await new_key(client, other_console, name="of an account made after the backup")
        for key in (kept, off, later, others_key):
            assert (await client.get("/api/geo/projects", headers=bearer(key["key"]))).status_code == 200
        assert (await client.get("/api/account/members", headers=member)).status_code == 200
        assert (await client.post("/api/usage/events", json=usage(account["id"]), headers=token)).status_code == 202

    restore(settings.database_url)

    async def refused(client: httpx.AsyncClient) -> dict[str, int]:
        """What each credential answers now (the kept key: 200; every other one: 401)."""
        answers = {
            name: (await client.get("/api/geo/projects", headers=bearer(key["key"]))).status_code
            for name, key in {"kept": kept, "off": off, "later": later, "others_key": others_key}.items()
        }
        answers["member"] = (await client.get("/api/account/members", headers=member)).status_code
        answers["other_console"] = (await client.get("/api/account", headers=other_console)).status_code
        answers["token"] = (await client.post("/api/usage/events", json=usage(account["id"]), headers=token)).status_code
        return answers

    settled = {"kept": 200, "off": 401, "later": 401, "others_key": 401, "member": 401, "other_console": 401, "token": 401}

    # Tollgate started on the restored Postgres before the reconciliation (the operator ran
    # `tollgate up` first): its edges rebuilt from Kafka admit the ghosts, until `tollgate
    # republish` ends them and the running edges follow
    async with running_app(settings) as (_, client):
        assert (await refused(client))["later"] == 200  # the defect, as it was
        await republish(settings)

        async def reconciled() -> bool:
            return await refused(client) == settled

        await wait_until(reconciled, timeout=20)

    # and an edge rebuilt from Kafka afterwards sees the same
    async with running_app(settings) as (_, client):
        assert await refused(client) == settled
        listed = (await client.get("/api/api-keys", headers=console)).json()["items"]
        assert sorted(k["id"] for k in listed) == sorted([kept["id"], off["id"]])
        assert next(k for k in listed if k["id"] == off["id"])["status"] == "disabled"  # as in the backup
        assert (await client.delete(f"/api/api-keys/{later['id']}", headers=console)).status_code == 404
        members = (await client.get("/api/account/members", headers=console)).json()["items"]
        assert [m["id"] for m in members] == [account["id"]]
        # the restored state goes on from there: the key disabled in the backup can be enabled again
        assert (await client.post(f"/api/api-keys/{off['id']}/toggle", headers=console)).status_code == 200
        assert (await client.get("/api/geo/projects", headers=bearer(off["key"]))).status_code == 200


async def test_sessions_ended_after_the_backup_stay_ended_after_the_restore(settings):
    """(review) A password change after the backup (the owner's answer to a stolen session) and a
    member's removal ended their sessions; the restored users, republished above Kafka's versions,
    carried the backup's sessions_not_before and let those sessions back in. They stay ended, as
    logouts after the backup do; the restored member and password log in again."""
    async with running_app(settings) as (_, client):
        account, console = await signup(client)
        login = await client.post("/api/auth/login", json={"email": account["email"], "password": PASSWORD})
        stolen = bearer(login.json()["access_token"])
        member_email = f"kept-{account['id'][:8]}@example.com"
        member = await add_member(client, console, member_email)
        member_id = next(
            m["id"]
            for m in (await client.get("/api/account/members", headers=console)).json()["items"]
            if m["email"] == member_email
        )
        back_up(settings.database_url)

        assert (await client.delete(f"/api/account/members/{member_id}", headers=console)).status_code == 204
        body = {"current_password": PASSWORD, "new_password": "a brand new passphrase"}
        assert (await client.put("/api/account/password", json=body, headers=console)).status_code == 204
        for headers in (stolen, member):
            assert (await client.get("/api/account", headers=headers)).status_code == 401

    restore(settings.database_url)
    await republish(settings)

    async with running_app(settings) as (_, client):  # edges rebuilt from the reconciled topics
        for headers in (stolen, member, console):
            refused = await client.get("/api/account", headers=headers)
            assert (refused.status_code, refused.json()["error"]["code"]) == (401, "invalid_session")
        for email in (account["email"], member_email):  # the backup's users and passwords
            again = await client.post("/api/auth/login", json={"email": email, "password": PASSWORD})
            assert again.status_code == 200, again.text
            fresh = bearer(again.json()["access_token"])
            assert (await client.get("/api/account", headers=fresh)).status_code == 200
