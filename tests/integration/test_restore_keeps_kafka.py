"""`tollgate restore` to an older point leaves Kafka as it was (docs/backup.md): the compacted
topics still hold every credential made after the backup (a key, a member and the member's
session, a service token, a whole account) and states newer than the restored rows (a key
disabled in the backup, enabled after it). Every edge rebuilds from those topics and keeps the
highest version, so before the fix the ghosts were admitted (a key the console no longer listed
and whose DELETE answered 404) and the key enabled after the backup stayed enabled.
`tollgate republish` (which `tollgate restore` runs) now reconciles: the ghosts are ended and the
restored rows republished at versions above Kafka's (services/keys/reconcile.py), each at the
stricter of its backup's state and Kafka's (a credential ended or disabled after the backup stays
so, in Postgres too).

Simulated without the local stack: the "backup" is a copy of the keys tables, the "restore" puts
them back (Tollgate stopped), Kafka is left as it was."""

import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest

from contracts.topics import ACCOUNTS
from services.edge.rate_store import KeyCheck, RedisStore
from services.keys import operator_cli
from services.keys.service import KeysService
from services.keys.store import KeysStore
from services.runtime.host.republish import republish
from services.runtime.platform.clock import system_clock
from services.runtime.platform.settings import Settings
from tests.integration.test_keys_api import PASSWORD, bearer, new_key, signup
from tests.support.apps import running_app
from tests.support.metering import wait_until
from tests.support.service_tokens import ADMIN_PATH, admin_headers, create_service_token

pytestmark = pytest.mark.integration

TABLES = ("accounts", "users", "api_keys", "service_tokens")  # in the order of their foreign keys


def back_up(database_url: str, name: str = "backup") -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for table in TABLES:
            conn.execute(f"CREATE TABLE public.{name}_{table} AS TABLE keys.{table}")


def restore(database_url: str, name: str = "backup") -> None:
    """Postgres as the backup had it (what `tollgate restore` does to the keys schema)."""
    with psycopg.connect(database_url) as conn:
        for table in reversed(TABLES):
            conn.execute(f"DELETE FROM keys.{table}")
        for table in TABLES:
            conn.execute(f"INSERT INTO keys.{table} SELECT * FROM public.{name}_{table}")


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
    logouts after the backup do; the restored password logs in again (the removed member, kept
    removed since, does not)."""
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
        # the backup's password logs in again; the member removed after the backup stays removed
        again = await client.post("/api/auth/login", json={"email": account["email"], "password": PASSWORD})
        assert again.status_code == 200, again.text
        assert (await client.get("/api/account", headers=bearer(again.json()["access_token"]))).status_code == 200
        removed = await client.post("/api/auth/login", json={"email": member_email, "password": PASSWORD})
        assert removed.status_code == 401, removed.text


async def test_credentials_ended_or_turned_off_after_the_backup_stay_so_after_the_restore(settings):
    """(review) A key deleted after the backup (it leaked, say), a key disabled, a service token
    revoked, a member removed after it: the restored rows were republished live above Kafka's
    versions, and the leaked key worked again. A restore keeps the stricter of the backup's row
    and Kafka's newest state, on the edges and in Postgres (the console lists what they admit)."""
    async with running_app(settings) as (_, client):
        account, console = await signup(client)
        kept = await new_key(client, console, name="kept")
        leaked = await new_key(client, console, name="deleted after the backup")
        paused = await new_key(client, console, name="disabled after the backup")
        member_email = f"gone-{account['id'][:8]}@example.com"
        member = await add_member(client, console, member_email)
        members = (await client.get("/api/account/members", headers=console)).json()["items"]
        member_id = next(m["id"] for m in members if m["email"] == member_email)
        members_key = await new_key(client, member, name="the removed member's")
        created = await create_service_token(client, settings, name="revoked after the backup")
        token = bearer(created["token"])
        back_up(settings.database_url)

        assert (await client.delete(f"/api/api-keys/{leaked['id']}", headers=console)).status_code == 204
        assert (await client.post(f"/api/api-keys/{paused['id']}/toggle", headers=console)).status_code == 200
        revoked = await client.delete(f"{ADMIN_PATH}/{created['id']}", headers=admin_headers(settings))
        assert revoked.status_code == 204
        assert (await client.delete(f"/api/account/members/{member_id}", headers=console)).status_code == 204

    restore(settings.database_url)

    async def answers(client: httpx.AsyncClient) -> dict[str, int]:
        found = {
            name: (await client.get("/api/geo/projects", headers=bearer(key["key"]))).status_code
            for name, key in {"kept": kept, "leaked": leaked, "paused": paused, "members_key": members_key}.items()
        }
        found["token"] = (await client.post("/api/usage/events", json=usage(account["id"]), headers=token)).status_code
        login = await client.post("/api/auth/login", json={"email": member_email, "password": PASSWORD})
        found["member_login"] = login.status_code
        return found

    settled = {"kept": 200, "leaked": 401, "paused": 401, "members_key": 401, "token": 401, "member_login": 401}

    async with running_app(settings) as (_, client):  # a running edge, then the reconciliation
        await republish(settings)

        async def reconciled() -> bool:
            return await answers(client) == settled

        await wait_until(reconciled, timeout=20)

    async with running_app(settings) as (_, client):  # and an edge rebuilt from Kafka afterwards
        assert await answers(client) == settled
        listed = {k["id"]: k["status"] for k in (await client.get("/api/api-keys", headers=console)).json()["items"]}
        assert listed == {kept["id"]: "enabled", paused["id"]: "disabled"}
        members = (await client.get("/api/account/members", headers=console)).json()["items"]
        assert [m["id"] for m in members] == [account["id"]]
        tokens = (await client.get(ADMIN_PATH, headers=admin_headers(settings))).json()["items"]
        assert next(t for t in tokens if t["id"] == created["id"])["revoked_at"] is not None
        audit = (await client.get("/api/audit-log", headers=console)).json()["items"]
        by_operator = {(e["action"], e["target"]["id"]) for e in audit if e["actor"].get("operator")}
        assert {("api_key.deleted", leaked["id"]), ("api_key.toggled", paused["id"])} <= by_operator
        assert ("member.removed", member_id) in by_operator
        # the console goes on from there: the key kept disabled can be enabled again
        assert (await client.post(f"/api/api-keys/{paused['id']}/toggle", headers=console)).status_code == 200
        assert (await client.get("/api/geo/projects", headers=bearer(paused["key"]))).status_code == 200


async def test_a_rotations_expiry_set_after_the_backup_is_kept_by_the_restore(settings):
    """A key rotated with a grace after the backup got an expiry (the replaced key, leaked maybe,
    must end with it); the restore brought back the backup's no-expiry, republished above Kafka's
    state: the replaced key lived for ever. The earlier expiry is kept, in Postgres too (listed
    `expired`, audited as the operator's); the successor, made after the backup, is ended."""
    async with running_app(settings) as (_, client):
        _, console = await signup(client)
        old = await new_key(client, console, name="rotated after the backup")
        back_up(settings.database_url)
        rotated = await client.post(f"/api/api-keys/{old['id']}/rotate", json={"grace_seconds": 2}, headers=console)
        assert rotated.status_code == 201, rotated.text
        successor = rotated.json()

    restore(settings.database_url)
    await republish(settings)

    async with running_app(settings) as (_, client):  # an edge rebuilt from the reconciled topics

        async def answers() -> tuple[int, int]:
            first = await client.get("/api/geo/projects", headers=bearer(old["key"]))
            second = await client.get("/api/geo/projects", headers=bearer(successor["key"]))
            return first.status_code, second.status_code

        async def expired() -> bool:
            return await answers() == (401, 401)

        await wait_until(expired, timeout=15)  # before the fix: (200, 401) for ever
        listed = {k["id"]: k for k in (await client.get("/api/api-keys", headers=console)).json()["items"]}
        assert list(listed) == [old["id"]] and listed[old["id"]]["status"] == "expired"

        async def audited() -> list[tuple[str, bool]]:  # once the audit.v1 consumer stored it
            audit = (await client.get("/api/audit-log", headers=console)).json()["items"]
            kept = [e for e in audit if e["actor"].get("operator") and e["target"]["id"] == old["id"]]
            return [(e["action"], e["details"]["kept_from_kafka"]) for e in kept]

        assert await wait_until(audited, timeout=15) == [("api_key.updated", True)]


async def test_an_account_deleted_after_the_backup_stays_deleted(settings):
    """An account Kafka holds deleted (a restore to a backup older than it ended it) and a backup
    that holds it restored afterwards: it, its owner's sessions and its key stay ended, and billing
    keeps its end (its paid plan is never renewed)."""
    async with running_app(settings) as (_, client):
        await signup(client)
        back_up(settings.database_url, "older")
        account, console = await signup(client)
        key = await new_key(client, console, name="of the account deleted after the backup")
        switched = await client.post("/api/billing/subscription/switch", json={"plan": "basic"}, headers=console)
        order = switched.json()["error"]["details"]["order"]
        assert (await client.post(f"/api/billing/orders/{order['id']}/pay", headers=console)).status_code == 200
        back_up(settings.database_url, "newer")

    restore(settings.database_url, "older")  # the account is deleted in Kafka
    await republish(settings)
    restore(settings.database_url, "newer")  # and this backup holds it

    async with running_app(settings) as (_, client):
        await republish(settings)

        async def ended() -> bool:
            answered = await client.get("/api/geo/projects", headers=bearer(key["key"]))
            login = await client.post("/api/auth/login", json={"email": account["email"], "password": PASSWORD})
            return (answered.status_code, login.status_code) == (401, 401)

        await wait_until(ended, timeout=20)

        async def billing_heard_it() -> bool:  # its paid plan is never renewed again (services/billing)
            async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
                cur = await conn.execute("SELECT deleted_at FROM billing.accounts WHERE account_id = %s", (account["id"],))
                row = await cur.fetchone()
            return row is not None and row[0] is not None

        await wait_until(billing_heard_it, timeout=20)

    async with running_app(settings) as (_, client):
        assert (await client.get("/api/geo/projects", headers=bearer(key["key"]))).status_code == 401
        assert (await client.get("/api/account", headers=console)).status_code == 401
        login = await client.post("/api/auth/login", json={"email": account["email"], "password": PASSWORD})
        assert login.status_code == 401

    # (leftovers) deleted in Postgres too: a later refill of accounts.v1 (a plain republish, given
    # nothing of Kafka) published the row live again before, and its e-mail stayed taken
    with psycopg.connect(settings.database_url) as conn:
        row = conn.execute("SELECT deleted_at FROM keys.accounts WHERE id = %s", (account["id"],)).fetchone()
    assert row is not None and row[0] is not None
    await refill(settings, [ACCOUNTS.name])
    async with running_app(settings) as (_, client):  # an edge rebuilt after the refill
        assert (await client.get("/api/account", headers=console)).status_code == 401
        again, again_console = await signup(client, account["email"])  # free again, as a removed member's
        assert again["id"] != account["id"]
        assert (await client.get("/api/account", headers=again_console)).json()["id"] == again["id"]


async def refill(settings: Settings, topics: list[str]) -> dict[str, int]:
    """What an owner's refill of a short topic does (services/runtime/platform/state_guard.py): its
    states from Postgres alone, reconciling nothing."""
    async with operator_cli._outbox(settings) as (pool, relay):
        service = KeysService(KeysStore(pool, relay), operator_cli._Flush(relay), system_clock, session_ttl_seconds=3600)
        return await service.republish(topics)


async def test_the_limiter_stores_revocations_are_witnesses_and_never_refuse_a_restored_key(settings):
    """Kafka may have forgotten what the shared limiter store still holds (a deletion's tombstone
    compacted away, a cluster replaced): its revocation entries, kept a week, refused the restored
    keys while the console listed them. A key the store holds deleted after the backup stays
    deleted, in Postgres too; a key it holds narrowed (new rules since, in no topic now) is
    restored above the entry: the stale entry no longer refuses it (503 before)."""
    async with running_app(settings) as (_, client):
        _, console = await signup(client)
        forgotten = await new_key(client, console, name="deleted after the backup, forgotten by Kafka")
        narrowed = await new_key(client, console, name="given new rules after the backup")
        back_up(settings.database_url)
    restore(settings.database_url)
    store = RedisStore(settings.redis_url)
    try:  # what the store kept of the writes after the backup, Kafka has not
        with psycopg.connect(settings.database_url) as conn:
            for key, how in ((forgotten, "deleted"), (narrowed, "narrowed")):
                row = conn.execute("SELECT version FROM keys.api_keys WHERE id = %s", (key["id"],)).fetchone()
                assert row is not None
                await store.revoke(KeyCheck(uuid.UUID(key["id"]), row[0] + 3), how=how)
    finally:
        await store.close()

    async def answers(client: httpx.AsyncClient) -> tuple[int, int]:
        first = await client.get("/api/geo/projects", headers=bearer(forgotten["key"]))
        second = await client.get("/api/geo/projects", headers=bearer(narrowed["key"]))
        return first.status_code, second.status_code

    async with running_app(settings) as (_, client):
        assert await answers(client) == (401, 503)  # the store's entries, before the reconcile
        await republish(settings)

        async def reconciled() -> bool:
            return await answers(client) == (401, 200)

        await wait_until(reconciled, timeout=20)
        listed = [k["id"] for k in (await client.get("/api/api-keys", headers=console)).json()["items"]]
        assert listed == [narrowed["id"]]
