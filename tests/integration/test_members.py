"""Members and roles (API.md, "Members (v2)") against real Kafka and Postgres: add, list, change
role, remove; the last owner; taken e-mails; unknown roles; what each role is refused; another
account's member; API keys refused on the console-only routes; and a removed member's key and
session refused by a second process within 1 s."""

import time
import uuid

import httpx
import pytest

from contracts.rate_limit import RateLimit
from tests.integration.test_edge_rate_limit import publish_plan
from tests.integration.test_keys_api import PASSWORD, bearer, code, new_key, signup
from tests.support.apps import ServeProcess
from tests.support.propagation import refused_within

pytestmark = pytest.mark.integration
MEMBERS = "/api/account/members"
GEO = "/api/geo/projects"


@pytest.fixture
def client(module_client: httpx.AsyncClient) -> httpx.AsyncClient:
    """Each test signs up accounts of its own: one platform for the module (conftest.module_client)."""
    return module_client


def _email() -> str:
    return f"m{uuid.uuid4().hex[:10]}@example.com"


async def add(client: httpx.AsyncClient, console: dict[str, str], role: str, email: str | None = None) -> dict:
    body = {"email": email or _email(), "name": f"A {role}", "password": PASSWORD, "role": role}
    response = await client.post(MEMBERS, json=body, headers=console)
    assert response.status_code == 201, response.text
    return response.json()


async def login(client: httpx.AsyncClient, email: str) -> dict[str, str]:
    response = await client.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    assert response.status_code == 200, response.text
    return bearer(response.json()["access_token"])


async def test_add_list_change_role_remove(client):
    account, owner = await signup(client)
    me = (await client.get("/api/account", headers=owner)).json()
    assert me["role"] == "owner" and me["roles"] == ["owner"]

    dev = await add(client, owner, "developer")
    assert set(dev) == {"id", "email", "name", "role", "created_at"} and dev["role"] == "developer"
    listed = (await client.get(MEMBERS, headers=owner)).json()["items"]
    assert [(m["id"], m["role"]) for m in listed] == [(account["id"], "owner"), (dev["id"], "developer")]

    as_dev = await login(client, dev["email"])
    mine = (await client.get("/api/account", headers=as_dev)).json()
    assert mine["id"] == account["id"] and mine["role"] == "developer" and mine["roles"] == ["developer"]
    key = await new_key(client, as_dev)
    items = (await client.get("/api/api-keys", headers=owner)).json()["items"]
    assert [k["created_by"] for k in items] == [dev["id"]]

    changed = await client.put(f"{MEMBERS}/{dev['id']}/role", json={"role": "viewer"}, headers=owner)
    assert changed.status_code == 200 and changed.json()["role"] == "viewer"
    # at once: the viewer's session and key can no longer write
    denied = await client.post("/api/api-keys", json={"name": "x"}, headers=as_dev)
    assert (denied.status_code, code(denied)) == (403, "permission_denied")
    denied = await client.post(GEO, json={"name": "p"}, headers=bearer(key["key"]))
    assert (denied.status_code, code(denied)) == (403, "permission_denied")
    assert (await client.get(GEO, headers=bearer(key["key"]))).status_code == 200
    assert (await client.get("/api/account", headers=as_dev)).json()["roles"] == ["viewer"]

    assert (await client.delete(f"{MEMBERS}/{dev['id']}", headers=owner)).status_code == 204
    gone = await client.get(GEO, headers=bearer(key["key"]))
    assert (gone.status_code, code(gone)) == (401, "invalid_api_key")
    ended = await client.get("/api/account", headers=as_dev)
    assert (ended.status_code, code(ended)) == (401, "invalid_session")
    assert [m["id"] for m in (await client.get(MEMBERS, headers=owner)).json()["items"]] == [account["id"]]
    refused = await client.post("/api/auth/login", json={"email": dev["email"], "password": PASSWORD})
    assert (refused.status_code, code(refused)) == (401, "invalid_credentials")
    assert (await client.delete(f"{MEMBERS}/{dev['id']}", headers=owner)).status_code == 404


async def test_last_owner_taken_email_and_unknown_role(client):
    account, owner = await signup(client)
    for response in (
        await client.put(f"{MEMBERS}/{account['id']}/role", json={"role": "developer"}, headers=owner),
        await client.delete(f"{MEMBERS}/{account['id']}", headers=owner),
    ):
        assert (response.status_code, code(response)) == (409, "last_owner")
    member = await add(client, owner, "viewer")
    for email in (member["email"], member["email"].upper(), account["email"]):
        taken = await client.post(
            MEMBERS, json={"email": email, "name": "x", "password": PASSWORD, "role": "viewer"}, headers=owner
        )
        assert (taken.status_code, code(taken)) == (409, "conflict")
    body = {"email": member["email"], "password": PASSWORD, "name": "x", "user_type": "individual"}
    taken = await client.post("/api/auth/register", json=body)
    assert (taken.status_code, code(taken)) == (409, "conflict")
    for bad in (
        await client.post(MEMBERS, json={"email": _email(), "name": "x", "password": PASSWORD, "role": "admin"}, headers=owner),
        await client.put(f"{MEMBERS}/{member['id']}/role", json={"role": "root"}, headers=owner),
    ):
        assert (bad.status_code, code(bad)) == (422, "validation_error")
    # a second owner: then the first may step down
    second = await add(client, owner, "owner")
    assert (await client.put(f"{MEMBERS}/{account['id']}/role", json={"role": "billing"}, headers=owner)).status_code == 200
    as_second = await login(client, second["email"])
    last = await client.delete(f"{MEMBERS}/{second['id']}", headers=as_second)
    assert (last.status_code, code(last)) == (409, "last_owner")


async def test_what_each_role_is_refused(client):
    _, owner = await signup(client)
    owners_key = await new_key(client, owner)
    viewer = await login(client, (await add(client, owner, "viewer"))["email"])
    billing = await login(client, (await add(client, owner, "billing"))["email"])
    dev = await login(client, (await add(client, owner, "developer"))["email"])
    for who in (viewer, billing, dev):
        assert (await client.get(MEMBERS, headers=who)).status_code == 200
        for response in (
            await client.post(MEMBERS, json={"email": _email(), "name": "x", "password": PASSWORD, "role": "owner"}, headers=who),
            await client.put(f"{MEMBERS}/{uuid.uuid4()}/role", json={"role": "owner"}, headers=who),
            await client.delete(f"{MEMBERS}/{uuid.uuid4()}", headers=who),
        ):
            assert (response.status_code, code(response)) == (403, "permission_denied")
    for who in (viewer, billing):
        denied = await client.post("/api/api-keys", json={"name": "x"}, headers=who)
        assert (denied.status_code, code(denied)) == (403, "permission_denied")
    # a developer writes its own keys, not others'
    own = await new_key(client, dev)
    for path in (f"/api/api-keys/{owners_key['id']}/toggle", f"/api/api-keys/{owners_key['id']}/rotate"):
        denied = await client.post(path, json={"grace_seconds": 0}, headers=dev)
        assert (denied.status_code, code(denied)) == (403, "permission_denied"), path
    denied = await client.delete(f"/api/api-keys/{owners_key['id']}", headers=dev)
    assert (denied.status_code, code(denied)) == (403, "permission_denied")
    assert (await client.post(f"/api/api-keys/{own['id']}/toggle", headers=dev)).json()["status"] == "disabled"
    assert (await client.post(f"/api/api-keys/{own['id']}/toggle", headers=owner)).json()["status"] == "enabled"


async def test_only_owner_and_billing_change_the_user_type(client):
    """The user type decides which plans the account may buy: `billing:write`, as the contract's role table says."""
    account, owner = await signup(client)
    viewer = await login(client, (await add(client, owner, "viewer"))["email"])
    dev = await login(client, (await add(client, owner, "developer"))["email"])
    billing = await login(client, (await add(client, owner, "billing"))["email"])
    for who in (viewer, dev):
        denied = await client.put("/api/account/user-type", json={"user_type": "enterprise"}, headers=who)
        assert (denied.status_code, code(denied)) == (403, "permission_denied")
    assert (await client.get("/api/account", headers=owner)).json()["user_type"] == "individual"  # unchanged
    for who, user_type in ((billing, "enterprise"), (owner, "individual")):
        changed = await client.put("/api/account/user-type", json={"user_type": user_type}, headers=who)
        assert changed.status_code == 200, changed.text
        assert changed.json()["id"] == account["id"] and changed.json()["user_type"] == user_type


async def test_another_accounts_member_is_404_and_an_api_key_cannot_manage_members(client):
    _, owner = await signup(client)
    _, other_owner = await signup(client)
    theirs = await add(client, other_owner, "viewer")
    for response in (
        await client.put(f"{MEMBERS}/{theirs['id']}/role", json={"role": "owner"}, headers=owner),
        await client.delete(f"{MEMBERS}/{theirs['id']}", headers=owner),
    ):
        assert (response.status_code, code(response)) == (404, "not_found")
    assert theirs["id"] not in [m["id"] for m in (await client.get(MEMBERS, headers=owner)).json()["items"]]
    key = bearer((await new_key(client, owner))["key"])
    for response in (
        await client.get(MEMBERS, headers=key),
        await client.post(MEMBERS, json={"email": _email(), "name": "x", "password": PASSWORD, "role": "owner"}, headers=key),
        await client.put(f"{MEMBERS}/{theirs['id']}/role", json={"role": "owner"}, headers=key),
        await client.delete(f"{MEMBERS}/{theirs['id']}", headers=key),
    ):
        assert (response.status_code, code(response)) == (403, "console_session_required")


async def test_a_removed_members_key_and_session_die_within_1_s_on_another_process(settings):
    a, b = ServeProcess(settings, "keys,geo"), ServeProcess(settings, "keys,geo")
    try:
        a.wait_ready()
        b.wait_ready()
        async with (
            httpx.AsyncClient(base_url=a.base_url, timeout=10) as on_a,
            httpx.AsyncClient(base_url=b.base_url, timeout=10) as on_b,
        ):
            account, owner = await signup(on_a)
            roomy = RateLimit(per_second=10_000, burst=10_000, per_minute=1_000_000)
            await publish_plan(settings, uuid.UUID(account["id"]), roomy)
            member = await add(on_a, owner, "developer")
            session = await login(on_a, member["email"])
            key = bearer((await new_key(on_a, session))["key"])
            started = time.perf_counter()
            while (await on_b.get(GEO, headers=key)).status_code != 200:  # B has learnt the key
                assert time.perf_counter() - started < 10
            assert (await on_b.get("/api/account", headers=session)).status_code == 200

            assert (await on_a.delete(f"{MEMBERS}/{member['id']}", headers=owner)).status_code == 204
            key_lag = await refused_within(on_b, GEO, key, "invalid_api_key", 1.0)
            session_lag = await refused_within(on_b, "/api/account", session, "invalid_session", 1.0)
            print(f"removal-to-refusal on the other process: key {key_lag * 1000:.1f} ms, session {session_lag * 1000:.1f} ms")
    finally:
        a.stop()
        b.stop()
