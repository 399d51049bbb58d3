"""Accounts, console sessions and API keys against real Kafka and Postgres (the whole platform)."""

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest

pytestmark = pytest.mark.integration

PASSWORD = "correct horse battery"


@pytest.fixture
def settings(module_settings):
    return module_settings


@pytest.fixture
def app_client(module_app_client):
    """Each test signs up accounts of its own: one platform for the module (conftest.module_app_client)."""
    return module_app_client


async def signup(client: httpx.AsyncClient, email: str | None = None) -> tuple[dict, dict[str, str]]:
    email = email or f"u{uuid.uuid4().hex[:8]}@example.com"
    body = {"email": email, "password": PASSWORD, "name": "Ada", "user_type": "individual"}
    created = await client.post("/api/auth/register", json=body)
    assert created.status_code == 201, created.text
    login = await client.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    assert login.status_code == 200, login.text
    return created.json(), {"Authorization": f"Bearer {login.json()['access_token']}"}


async def new_key(client: httpx.AsyncClient, console: dict[str, str], **body: object) -> dict:
    response = await client.post("/api/api-keys", json={"name": "ci", **body}, headers=console)
    assert response.status_code == 201, response.text
    return response.json()


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


async def test_register_login_account_and_key_lifecycle(client):
    account, console = await signup(client)
    assert account["roles"] == ["owner"] and account["plan"] == "free" and account["user_type"] == "individual"
    me = await client.get("/api/account", headers=console)
    assert me.status_code == 200 and me.json() == account

    key = await new_key(client, console)
    secret = key["key"]
    assert secret.startswith("sk-") and len(secret) >= 43
    assert key["masked_key"] == f"sk-{secret[3:7]}...{secret[-4:]}"
    assert key["status"] == "enabled"

    ok = await client.get("/api/geo/projects", headers=bearer(secret))
    assert ok.status_code == 200, ok.text
    assert ok.json() == {"items": []}

    listed = (await client.get("/api/api-keys", headers=console)).json()["items"]
    assert [k["id"] for k in listed] == [key["id"]] and "key" not in listed[0]

    toggled = await client.post(f"/api/api-keys/{key['id']}/toggle", headers=console)
    assert toggled.json() == {"id": key["id"], "status": "disabled"}
    assert code(await client.get("/api/geo/projects", headers=bearer(secret))) == "api_key_disabled"
    assert (await client.post(f"/api/api-keys/{key['id']}/toggle", headers=console)).json()["status"] == "enabled"
    assert (await client.get("/api/geo/projects", headers=bearer(secret))).status_code == 200

    assert (await client.delete(f"/api/api-keys/{key['id']}", headers=console)).status_code == 204
    assert code(await client.get("/api/geo/projects", headers=bearer(secret))) == "invalid_api_key"
    assert (await client.delete(f"/api/api-keys/{key['id']}", headers=console)).status_code == 404


async def test_a_script_learns_its_account_id_with_its_api_key(client):
    """API.md: `GET /api/account` takes a session or an API key ("a script learns its account id here")."""
    account, console = await signup(client)
    key = bearer((await new_key(client, console))["key"])
    me = await client.get("/api/account", headers=key)
    assert me.status_code == 200, me.text
    assert me.json() == {**account, "role": "owner"}  # as its creator sees it
    assert me.headers["X-RateLimit-Limit"]  # an ordinary API-key call: rate-limited (and counted in api_calls)
    developer = await client.post(
        "/api/account/members",
        json={"email": f"d{uuid.uuid4().hex[:8]}@example.com", "name": "Dev", "password": PASSWORD, "role": "developer"},
        headers=console,
    )
    assert developer.status_code == 201, developer.text
    login = await client.post("/api/auth/login", json={"email": developer.json()["email"], "password": PASSWORD})
    devs_key = bearer((await new_key(client, bearer(login.json()["access_token"])))["key"])
    theirs = (await client.get("/api/account", headers=devs_key)).json()
    assert (theirs["id"], theirs["role"], theirs["roles"]) == (account["id"], "developer", ["developer"])


async def admin_roles(client: httpx.AsyncClient, settings, account_id: str, roles: list[str]) -> httpx.Response:
    token = settings.admin_token.get_secret_value()
    return await client.put(f"/api/admin/accounts/{account_id}/roles", json={"roles": roles}, headers=bearer(token))


async def test_error_table_rows_about_keys_and_sessions(app_client, settings):
    app, client = app_client
    account, console = await signup(client)
    key = await new_key(client, console)
    api_key = bearer(key["key"])

    # 401 missing_credentials
    for headers in ({}, {"Authorization": "Basic abc"}, {"Authorization": "Bearer "}):
        response = await client.get("/api/geo/projects", headers=headers)
        assert (response.status_code, code(response)) == (401, "missing_credentials")
    # 401 invalid_api_key: unknown (deleted is checked in the lifecycle test)
    unknown = await client.get("/api/geo/projects", headers=bearer("sk-" + "A" * 48))
    assert (unknown.status_code, code(unknown)) == (401, "invalid_api_key")
    # 401 invalid_session: forged and expired console sessions
    forged = await client.get("/api/account", headers=bearer("tg1.e30.bad"))
    assert (forged.status_code, code(forged)) == (401, "invalid_session")
    edge = app.state.runtime.edge
    old = edge.issue_session(
        uuid.UUID(account["id"]), "s1", datetime.now(UTC) - timedelta(seconds=settings.session_ttl_seconds + 1)
    )
    expired = await client.get("/api/account", headers=bearer(old))
    assert (expired.status_code, code(expired)) == (401, "invalid_session")
    # 401 on login with a wrong password (extension code)
    wrong = await client.post("/api/auth/login", json={"email": account["email"], "password": "nope-nope-nope"})
    assert (wrong.status_code, code(wrong)) == (401, "invalid_credentials")
    # 403 console_session_required: key management and account calls refuse API keys
    kid = key["id"]
    for method, path, body in [
        ("POST", "/api/api-keys", {"name": "x"}),
        ("GET", "/api/api-keys", None),
        ("POST", f"/api/api-keys/{kid}/toggle", None),
        ("DELETE", f"/api/api-keys/{kid}", None),
        ("POST", f"/api/api-keys/{kid}/rotate", {"grace_seconds": 0}),
        ("PUT", "/api/account/user-type", {"user_type": "enterprise"}),
    ]:
        response = await client.request(method, path, json=body, headers=api_key)
        assert (response.status_code, code(response)) == (403, "console_session_required"), (method, path)
    assert (await client.get("/api/geo/projects", headers=api_key)).status_code == 200  # the key is untouched
    # 404 for another account's key (never 403)
    _, other_console = await signup(client)
    for method, path, body in [
        ("POST", f"/api/api-keys/{kid}/toggle", None),
        ("DELETE", f"/api/api-keys/{kid}", None),
        ("POST", f"/api/api-keys/{kid}/rotate", {"grace_seconds": 0}),
    ]:
        response = await client.request(method, path, json=body, headers=other_console)
        assert (response.status_code, code(response)) == (404, "not_found"), (method, path)
    assert (await client.get("/api/api-keys", headers=other_console)).json() == {"items": []}
    assert (await client.get("/api/geo/projects", headers=api_key)).status_code == 200
    # 409 conflict (extension): the e-mail exists, whatever its case
    again = await client.post(
        "/api/auth/register",
        json={"email": account["email"].upper(), "password": PASSWORD, "name": "B", "user_type": "individual"},
    )
    assert (again.status_code, code(again)) == (409, "conflict")
    # 422 validation_error with details
    for path, body in [
        ("/api/api-keys", {}),
        ("/api/api-keys", {"name": "x", "expires_at": "2001-01-01T00:00:00Z"}),
        (f"/api/api-keys/{kid}/rotate", {"grace_seconds": 604801}),
        (f"/api/api-keys/{kid}/rotate", {"grace_seconds": -1}),
    ]:
        response = await client.post(path, json=body, headers=console)
        assert (response.status_code, code(response)) == (422, "validation_error"), (path, body)
        assert response.json()["error"]["details"]
    # user type: console only, republished; the account answers it at once
    changed = await client.put("/api/account/user-type", json={"user_type": "enterprise"}, headers=console)
    assert changed.status_code == 200 and changed.json()["user_type"] == "enterprise"
    assert (await client.get("/api/account", headers=console)).json()["user_type"] == "enterprise"


async def test_admin_roles_endpoint_is_guarded(client, settings):
    account, _ = await signup(client)
    path = f"/api/admin/accounts/{account['id']}/roles"
    assert (await client.put(path, json={"roles": ["viewer"]})).status_code == 401
    assert (await client.put(path, json={"roles": ["viewer"]}, headers=bearer("not-the-token"))).status_code == 403
    assert (await admin_roles(client, settings, str(uuid.uuid4()), ["viewer"])).status_code == 404
    assert (await admin_roles(client, settings, account["id"], [])).status_code == 422


async def test_a_viewer_key_reads_but_cannot_write_and_promotion_lifts_it_at_once(client, settings):
    account, console = await signup(client)
    key = bearer((await new_key(client, console))["key"])
    demoted = await admin_roles(client, settings, account["id"], ["viewer"])
    assert demoted.status_code == 200 and demoted.json()["roles"] == ["viewer"]

    assert (await client.get("/api/geo/projects", headers=key)).status_code == 200
    denied = await client.post("/api/geo/projects", json={"name": "p"}, headers=key)
    assert (denied.status_code, code(denied)) == (403, "permission_denied")
    console_denied = await client.post("/api/api-keys", json={"name": "x"}, headers=console)
    assert (console_denied.status_code, code(console_denied)) == (403, "permission_denied")
    assert (await client.get("/api/account", headers=console)).json()["roles"] == ["viewer"]

    assert (await admin_roles(client, settings, account["id"], ["owner"])).status_code == 200
    created = await client.post("/api/geo/projects", json={"name": "p"}, headers=key)  # no wait: at once
    assert created.status_code == 201, created.text
    listed = (await client.get("/api/geo/projects", headers=key)).json()["items"]
    assert [p["id"] for p in listed] == [created.json()["id"]]
    assert (await client.delete(f"/api/geo/projects/{created.json()['id']}", headers=key)).status_code == 204
    assert (await client.get("/api/geo/projects", headers=key)).json() == {"items": []}


async def test_expiry_at_the_exact_instant_and_rotation_with_grace(client):
    _, console = await signup(client)
    expires_at = datetime.now(UTC) + timedelta(seconds=1.5)
    short = await new_key(client, console, expires_at=expires_at.isoformat())
    assert (await client.get("/api/geo/projects", headers=bearer(short["key"]))).status_code == 200
    await asyncio.sleep(max(0.0, (expires_at - datetime.now(UTC)).total_seconds()))
    late = await client.get("/api/geo/projects", headers=bearer(short["key"]))
    assert (late.status_code, code(late)) == (401, "api_key_expired")

    old = await new_key(client, console, name="prod")
    rotated = await client.post(f"/api/api-keys/{old['id']}/rotate", json={"grace_seconds": 2}, headers=console)
    assert rotated.status_code == 201, rotated.text
    new = rotated.json()
    assert new["name"] == "prod" and new["key"] != old["key"] and new["status"] == "enabled"
    assert (await client.get("/api/geo/projects", headers=bearer(old["key"]))).status_code == 200  # grace
    assert (await client.get("/api/geo/projects", headers=bearer(new["key"]))).status_code == 200
    listed = {k["id"]: k for k in (await client.get("/api/api-keys", headers=console)).json()["items"]}
    assert listed[old["id"]]["expires_at"] is not None
    # after the grace period the old key is rejected, then deleted for good
    deadline = time.monotonic() + 10
    while True:
        response = await client.get("/api/geo/projects", headers=bearer(old["key"]))
        if response.status_code == 401 and code(response) == "invalid_api_key":
            break
        assert response.status_code == 200 or code(response) == "api_key_expired"
        assert time.monotonic() < deadline, response.text
        await asyncio.sleep(0.1)
    assert old["id"] not in {k["id"] for k in (await client.get("/api/api-keys", headers=console)).json()["items"]}

    gone = await client.post(f"/api/api-keys/{new['id']}/rotate", json={"grace_seconds": 0}, headers=console)
    assert gone.status_code == 201
    dead = await client.get("/api/geo/projects", headers=bearer(new["key"]))
    assert (dead.status_code, code(dead)) == (401, "invalid_api_key")  # grace 0: deleted at once
    assert (await client.get("/api/geo/projects", headers=bearer(gone.json()["key"]))).status_code == 200
