"""Accounts, console sessions and API keys against real Kafka and Postgres (the whole platform)."""

import uuid

import httpx
import pytest

pytestmark = pytest.mark.integration

PASSWORD = "correct horse battery"


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
