"""Service tokens (`st-...`, issue 15 item 1) on real Kafka and Postgres: the operator's HTTP and CLI
lifecycle, only the hash stored, who may write usage, and a revocation in force on a second
`serve` process within a second."""

import asyncio
import json
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime

import httpx
import psycopg
import pytest

from contracts.credentials import hash_secret
from tests.integration.test_keys_api import bearer, code, new_key, signup
from tests.integration.test_keys_two_processes import _all_kafka_messages, _all_postgres_rows
from tests.support.apps import REPO, ServeProcess, running_app, settings_env
from tests.support.metering import wait_until
from tests.support.service_tokens import ADMIN_PATH, admin_headers, create_service_token

pytestmark = pytest.mark.integration
INGEST = "/api/usage/events"
GEO = "/api/geo/projects"


@pytest.fixture
def settings(module_settings):
    return module_settings


@pytest.fixture
def app_client(module_app_client):
    """Each test signs up its own accounts and finds its own service tokens by id: one platform for
    the module (conftest.module_app_client). A test that starts its own platform or `serve`
    processes takes `fresh_settings`: an environment of its own, not the module's."""
    return module_app_client


def _usage(account_id: str) -> dict:
    return {
        "id": str(uuid.uuid4()),
        "time": datetime.now(UTC).isoformat(),
        "account_id": account_id,
        "resource": "ai_tokens",
        "quantity": 30,
        "provider": "openai",
        "model": "gpt-4o",
        "input_tokens": 10,
        "output_tokens": 20,
        "source": "test",
    }


def _cli(settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.runtime.host.cli", "service-token", *args],
        env=settings_env(settings),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def _refused_within(client: httpx.AsyncClient, token: str, deadline_s: float) -> float:
    """Seconds until `client`'s process answers 401 invalid_service_token to `token`."""
    started = time.perf_counter()
    while True:
        response = await client.get(GEO, headers=bearer(token))
        if response.status_code == 401 and code(response) == "invalid_service_token":
            return time.perf_counter() - started
        assert (response.status_code, code(response)) == (403, "permission_denied"), response.text
        assert time.perf_counter() - started < deadline_s, f"still known after {deadline_s} s"
        await asyncio.sleep(0.005)


async def test_http_lifecycle_and_who_may_write_usage(app_client, settings):
    _, client = app_client
    admin = admin_headers(settings)
    account, console = await signup(client)
    key = await new_key(client, console)

    created = await client.post(ADMIN_PATH, json={"name": "ai-gateway", "scopes": ["usage:write"]}, headers=admin)
    assert created.status_code == 201, created.text
    body = created.json()
    assert set(body) == {"id", "name", "scopes", "token", "created_at"}
    assert body["name"] == "ai-gateway" and body["scopes"] == ["usage:write"]
    token = body["token"]
    assert token.startswith("st-") and len(token) >= 43
    assert all(c.isalnum() or c in "-_" for c in token[3:])

    # the token writes usage for any account, at once (the 201 came after it was in force here)
    ok = await client.post(INGEST, json={"events": [_usage(account["id"]), _usage(str(uuid.uuid4()))]}, headers=bearer(token))
    assert ok.status_code == 202, ok.text
    assert ok.json() == {"accepted": 2, "duplicates": 0}

    # the customer's own credentials never write its meter; nor does the operator's ADMIN_TOKEN
    for headers in (bearer(key["key"]), console, admin):
        refused = await client.post(INGEST, json={"events": [_usage(account["id"])]}, headers=headers)
        assert (refused.status_code, code(refused)) == (403, "permission_denied"), refused.text
    # a bad customer credential is its own 401; an unknown st- token is invalid_service_token
    unknown = "st-" + "A" * 48
    for headers, expected in ((bearer("sk-" + "x" * 48), "invalid_api_key"), (bearer(unknown), "invalid_service_token")):
        refused = await client.post(INGEST, json={"events": [_usage(account["id"])]}, headers=headers)
        assert (refused.status_code, code(refused)) == (401, expected)
    assert code(await client.post(INGEST, json={"events": [_usage(account["id"])]})) == "missing_credentials"

    # a service token is no customer: every customer endpoint refuses it
    for method, path in (("GET", GEO), ("GET", "/api/billing/check-quota"), ("GET", "/api/api-keys"), ("GET", "/api/account")):
        refused = await client.request(method, path, headers=bearer(token))
        assert (refused.status_code, code(refused)) == (403, "permission_denied"), (path, refused.text)
        assert code(await client.request(method, path, headers=bearer(unknown))) == "invalid_service_token"

    # list: every field but the token; last_used_at follows the use (approximate, batched)
    async def listed_used() -> dict | None:
        items = (await client.get(ADMIN_PATH, headers=admin)).json()["items"]
        (item,) = [i for i in items if i["id"] == body["id"]]
        return item if item["last_used_at"] is not None else None

    item = await wait_until(listed_used, timeout=15, interval=0.5)
    assert set(item) == {"id", "name", "scopes", "created_at", "last_used_at", "revoked_at"}
    assert item["revoked_at"] is None and item["created_at"] == body["created_at"]
    assert token not in (await client.get(ADMIN_PATH, headers=admin)).text

    # revoke: refused by this process when the 204 arrives
    assert (await client.delete(f"{ADMIN_PATH}/{body['id']}", headers=admin)).status_code == 204
    gone = await client.post(INGEST, json={"events": [_usage(account["id"])]}, headers=bearer(token))
    assert (gone.status_code, code(gone)) == (401, "invalid_service_token")
    assert (await client.delete(f"{ADMIN_PATH}/{body['id']}", headers=admin)).status_code == 204  # idempotent
    missing = await client.delete(f"{ADMIN_PATH}/{uuid.uuid4()}", headers=admin)
    assert (missing.status_code, code(missing)) == (404, "not_found")
    revoked = [i for i in (await client.get(ADMIN_PATH, headers=admin)).json()["items"] if i["id"] == body["id"]]
    assert revoked[0]["revoked_at"] is not None

    # only the hash is stored and published
    with psycopg.connect(settings.database_url) as conn:
        (stored,) = conn.execute("SELECT hash FROM keys.service_tokens WHERE id = %s", (body["id"],)).fetchone()
    assert stored == hash_secret(token)
    rows = _all_postgres_rows(settings.database_url)
    messages = await _all_kafka_messages(settings)
    assert token[3:] not in rows and token[3:].encode() not in messages
    assert hash_secret(token).encode() in messages


async def test_admin_routes_refuse_customers_and_bad_input(app_client, settings):
    _, client = app_client
    _, console = await signup(client)
    key = await new_key(client, console)
    for headers in (bearer(key["key"]), console, bearer("wrong-admin-token")):
        for method, path in (("POST", ADMIN_PATH), ("GET", ADMIN_PATH), ("DELETE", f"{ADMIN_PATH}/{uuid.uuid4()}")):
            refused = await client.request(method, path, headers=headers, json={"name": "x"} if method == "POST" else None)
            assert (refused.status_code, code(refused)) == (403, "permission_denied"), refused.text
    assert code(await client.get(ADMIN_PATH)) == "missing_credentials"
    admin = admin_headers(settings)
    for bad in ({"name": ""}, {"name": "x", "scopes": ["keys:write"]}, {"name": "x", "scopes": []}, {"scopes": ["usage:write"]}):
        refused = await client.post(ADMIN_PATH, json=bad, headers=admin)
        assert (refused.status_code, code(refused)) == (422, "validation_error"), (bad, refused.text)
        assert refused.json()["error"]["details"]
    assert (await client.delete(f"{ADMIN_PATH}/not-a-uuid", headers=admin)).status_code == 422
    # the default scope is usage:write
    made = await client.post(ADMIN_PATH, json={"name": "defaulted"}, headers=admin)
    assert made.status_code == 201 and made.json()["scopes"] == ["usage:write"]


async def test_admin_routes_do_not_exist_without_admin_token(fresh_settings):
    settings = fresh_settings
    async with running_app(settings.model_copy(update={"admin_token": None}), ["keys"]) as (_, client):
        for method in ("GET", "POST"):
            missing = await client.request(method, ADMIN_PATH, headers=bearer("anything"), json={"name": "x"})
            assert (missing.status_code, code(missing)) == (404, "not_found")


async def test_cli_lifecycle_in_force_in_a_running_process(app_client, settings):
    _, client = app_client
    account, _ = await signup(client)
    created = await asyncio.to_thread(_cli, settings, "create", "content-service", "--scope", "usage:write")
    assert created.returncode == 0, created.stderr
    printed = json.loads(created.stdout)
    assert set(printed) == {"id", "token"} and printed["token"].startswith("st-") and len(printed["token"]) >= 43
    token = printed["token"]

    async def accepted() -> bool:
        response = await client.post(INGEST, json={"events": [_usage(account["id"])]}, headers=bearer(token))
        return response.status_code == 202

    await wait_until(accepted, timeout=5, interval=0.01)

    listed = await asyncio.to_thread(_cli, settings, "list")
    assert listed.returncode == 0, listed.stderr
    (item,) = [i for i in json.loads(listed.stdout)["items"] if i["id"] == printed["id"]]
    assert item["name"] == "content-service" and item["scopes"] == ["usage:write"] and item["revoked_at"] is None
    assert token not in listed.stdout and token[3:] not in listed.stderr
    # the HTTP list shows the CLI's token: one store
    http_items = (await client.get(ADMIN_PATH, headers=admin_headers(settings))).json()["items"]
    assert printed["id"] in {i["id"] for i in http_items}

    revoked = await asyncio.to_thread(_cli, settings, "revoke", printed["id"])
    assert revoked.returncode == 0, revoked.stderr
    # the CLI returned after Kafka's ack: the running process refuses within a second
    lag = await _refused_within(client, token, deadline_s=1.0)
    print(f"CLI revoke -> refusal lag: {lag * 1000:.1f} ms")
    refused = await client.post(INGEST, json={"events": [_usage(account["id"])]}, headers=bearer(token))
    assert (refused.status_code, code(refused)) == (401, "invalid_service_token")

    unknown = await asyncio.to_thread(_cli, settings, "revoke", str(uuid.uuid4()))
    assert unknown.returncode == 1 and "no service token" in unknown.stderr
    bad_scope = await asyncio.to_thread(_cli, settings, "create", "x", "--scope", "keys:write")
    assert bad_scope.returncode != 0


async def test_revocation_refused_by_a_second_process_within_one_second(fresh_settings):
    settings = fresh_settings
    a, b = ServeProcess(settings, "keys,geo"), ServeProcess(settings, "keys,geo")
    tokens: list[str] = []
    try:
        a.wait_ready()
        b.wait_ready()
        async with (
            httpx.AsyncClient(base_url=a.base_url, timeout=10) as on_a,
            httpx.AsyncClient(base_url=b.base_url, timeout=10) as on_b,
        ):
            lags = []
            for _ in range(3):
                made = await create_service_token(on_a, settings)
                token = made["token"]
                tokens.append(token)

                async def known_on_b(token: str = token) -> bool:
                    return (await on_b.get(GEO, headers=bearer(token))).status_code == 403

                await wait_until(known_on_b, timeout=5, interval=0.01)
                deleted = await on_a.delete(f"{ADMIN_PATH}/{made['id']}", headers=admin_headers(settings))
                assert deleted.status_code == 204
                now_a = await on_a.get(GEO, headers=bearer(token))
                assert (now_a.status_code, code(now_a)) == (401, "invalid_service_token")
                lags.append(await _refused_within(on_b, token, deadline_s=1.0))
            print(f"revoke-to-refusal lag on the other process: {[round(x * 1000, 1) for x in lags]} ms")
    finally:
        a.stop()
        b.stop()
    logs = a.log_path.read_text() + b.log_path.read_text()
    assert len(tokens) == 3 and not [t for t in tokens if t[3:] in logs]
