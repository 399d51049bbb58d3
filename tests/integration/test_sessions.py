"""(v2) Logout and password change end console sessions; key listing shows `expired`;
`last_used_at` moves only on admitted calls. Real Kafka and Postgres, the whole platform."""

import asyncio
import json
import logging
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer

from contracts.events import CallEvent, SessionRevoked, UserState
from contracts.topics import CALLS, SESSIONS, USERS
from services.edge import sessions
from services.keys.store import KeysTx
from tests.integration.test_keys_api import PASSWORD, bearer, code, new_key, signup
from tests.support.apps import running_app

pytestmark = pytest.mark.integration
NEW_PASSWORD = "a brand new passphrase"


@pytest.fixture
def settings(module_settings):
    return module_settings


@pytest.fixture
def app_client(module_app_client):
    """Each test signs up accounts of its own: one platform for the module (conftest.module_app_client)."""
    return module_app_client


async def _login(client, email: str, password: str):
    return await client.post("/api/auth/login", json={"email": email, "password": password})


async def _consumed(settings, topic: str) -> list[dict]:
    """Every event on `topic` (prefixed), read from the start."""
    consumer = AIOKafkaConsumer(
        settings.topic(topic), bootstrap_servers=settings.kafka_bootstrap_servers, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        events: list[dict] = []
        while batches := await consumer.getmany(timeout_ms=1500):  # until idle
            events += [json.loads(r.value) for records in batches.values() for r in records if r.value]
        return sorted(events, key=lambda e: e["time"])
    finally:
        await consumer.stop()


async def test_logout_ends_this_session_only_and_a_second_logout_is_401(client, settings):
    account, console = await signup(client)
    other = {"Authorization": f"Bearer {(await _login(client, account['email'], PASSWORD)).json()['access_token']}"}
    assert (await client.get("/api/account", headers=console)).status_code == 200

    out = await client.post("/api/auth/logout", headers=console)
    assert out.status_code == 204 and out.content == b""
    refused = await client.get("/api/account", headers=console)
    assert (refused.status_code, code(refused)) == (401, "invalid_session")
    again = await client.post("/api/auth/logout", headers=console)
    assert (again.status_code, code(again)) == (401, "invalid_session")
    assert set(again.json()["error"]) >= {"code", "message", "request_id"}
    # the user's other session lives on
    assert (await client.get("/api/account", headers=other)).status_code == 200

    # sessions.v1 carries the session id and user (= account) id, never the token
    events = [e for e in await _consumed(settings, SESSIONS.name) if e["account_id"] == account["id"]]
    assert len(events) == 1
    event = SessionRevoked.model_validate(events[0])
    token = console["Authorization"].removeprefix("Bearer ")
    claims = sessions.verify(settings.session_secret.get_secret_value().encode(), token, datetime.now(UTC) - timedelta(hours=1))
    assert event.user_id == uuid.UUID(account["id"]) and event.session_id == claims.session_id
    assert console["Authorization"].removeprefix("Bearer ") not in str(events)

    # users.v1 got the owner at registration
    users = [UserState.model_validate(e) for e in await _consumed(settings, USERS.name) if e["account_id"] == account["id"]]
    assert [(u.user_id, u.role.value, u.sessions_not_before) for u in users] == [(uuid.UUID(account["id"]), "owner", None)]


async def test_password_change_ends_every_session_of_the_user(client, settings):
    account, console = await signup(client)
    second = {"Authorization": f"Bearer {(await _login(client, account['email'], PASSWORD)).json()['access_token']}"}
    _, bystander_console = await signup(client)
    key = await new_key(client, console)

    changed = await client.put(
        "/api/account/password", json={"current_password": PASSWORD, "new_password": NEW_PASSWORD}, headers=console
    )
    assert changed.status_code == 204, changed.text
    for headers in (console, second):
        refused = await client.get("/api/account", headers=headers)
        assert (refused.status_code, code(refused)) == (401, "invalid_session")
    # API keys are not sessions; another account's sessions are untouched
    assert (await client.get("/api/geo/projects", headers=bearer(key["key"]))).status_code == 200
    assert (await client.get("/api/account", headers=bystander_console)).status_code == 200

    assert code(await _login(client, account["email"], PASSWORD)) == "invalid_credentials"
    fresh = await _login(client, account["email"], NEW_PASSWORD)
    assert fresh.status_code == 200
    assert (await client.get("/api/account", headers=bearer(fresh.json()["access_token"]))).status_code == 200

    users = [UserState.model_validate(e) for e in await _consumed(settings, USERS.name) if e["account_id"] == account["id"]]
    assert users[-1].sessions_not_before is not None
    assert abs((users[-1].sessions_not_before - datetime.now(UTC)).total_seconds()) < 30
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        row = await (await conn.execute("SELECT password_hash FROM keys.accounts WHERE id = %s", [account["id"]])).fetchone()
    assert row is not None and row[0].startswith("$argon2") and NEW_PASSWORD not in row[0]


async def test_password_change_refusals(client):
    account, console = await signup(client)

    async def put(body: dict, headers=console):
        return await client.put("/api/account/password", json=body, headers=headers)

    wrong = await put({"current_password": "not the password", "new_password": NEW_PASSWORD})
    assert (wrong.status_code, code(wrong)) == (403, "permission_denied")
    for weak in ("short", "x" * 1025):
        response = await put({"current_password": PASSWORD, "new_password": weak})
        assert (response.status_code, code(response)) == (422, "validation_error"), weak
        assert response.json()["error"]["details"]
    same = await put({"current_password": PASSWORD, "new_password": PASSWORD})
    assert (same.status_code, code(same)) == (422, "validation_error")
    for bad in ({}, {"current_password": PASSWORD}, {"current_password": 1, "new_password": NEW_PASSWORD}, []):
        response = await client.put("/api/account/password", json=bad, headers=console)
        assert (response.status_code, code(response)) == (422, "validation_error"), bad
    # none of those changed anything: the session and the password still work
    assert (await client.get("/api/account", headers=console)).status_code == 200
    assert (await _login(client, account["email"], PASSWORD)).status_code == 200

    missing = await client.put("/api/account/password", json={"current_password": PASSWORD, "new_password": NEW_PASSWORD})
    assert (missing.status_code, code(missing)) == (401, "missing_credentials")


async def test_api_keys_cannot_log_out_or_change_the_password(client):
    account, console = await signup(client)
    key = bearer((await new_key(client, console))["key"])
    out = await client.post("/api/auth/logout", headers=key)
    assert (out.status_code, code(out)) == (403, "console_session_required")
    pw = await client.put("/api/account/password", json={"current_password": PASSWORD, "new_password": NEW_PASSWORD}, headers=key)
    assert (pw.status_code, code(pw)) == (403, "console_session_required")
    assert (await client.get("/api/account", headers=console)).status_code == 200
    assert (await _login(client, account["email"], PASSWORD)).status_code == 200


async def test_listing_shows_expired_keys(client):
    _, console = await signup(client)
    expires_at = datetime.now(UTC) + timedelta(seconds=1.5)
    short = await new_key(client, console, expires_at=expires_at.isoformat())
    lasting = await new_key(client, console)
    disabled_then_expired = await new_key(client, console, expires_at=expires_at.isoformat())
    assert (await client.post(f"/api/api-keys/{disabled_then_expired['id']}/toggle", headers=console)).status_code == 200

    def statuses(items: list[dict]) -> dict[str, str]:
        return {i["id"]: i["status"] for i in items}

    before = statuses((await client.get("/api/api-keys", headers=console)).json()["items"])
    assert before == {short["id"]: "enabled", lasting["id"]: "enabled", disabled_then_expired["id"]: "disabled"}
    await asyncio.sleep(max(0.0, (expires_at - datetime.now(UTC)).total_seconds()) + 0.05)
    after = statuses((await client.get("/api/api-keys", headers=console)).json()["items"])
    assert after == {short["id"]: "expired", lasting["id"]: "enabled", disabled_then_expired["id"]: "expired"}
    # toggling an expired key still works (stored state), and it stays listed as expired
    toggled = await client.post(f"/api/api-keys/{short['id']}/toggle", headers=console)
    assert toggled.json()["status"] == "disabled"
    assert statuses((await client.get("/api/api-keys", headers=console)).json()["items"])[short["id"]] == "expired"


async def test_last_used_at_moves_only_on_admitted_calls(app_client, settings):
    app, client = app_client
    account, console = await signup(client)
    key = await new_key(client, console)
    broker = app.state.runtime.broker
    # later than the admitted call below, within calls.v1's 5 minutes ahead (else dead-lettered)
    future = datetime.now(UTC) + timedelta(minutes=3)

    async def publish_call(error_code: str | None, status: int) -> None:
        event = CallEvent(
            time=future,
            account_id=uuid.UUID(account["id"]),
            api_key_id=uuid.UUID(key["id"]),
            method="GET",
            path="/api/geo/projects",
            status=status,
            ip="203.0.113.9",
            latency_ms=1.0,
            error_code=error_code,
        )
        # keyed by account like the edge's: same partition, so read before the admitted call below
        await broker.publish(event, settings.topic(CALLS.name), key=account["id"].encode())

    await publish_call("rate_limited", 429)
    await publish_call("api_key_disabled", 401)
    started = datetime.now(UTC)
    assert (await client.get("/api/geo/projects", headers=bearer(key["key"]))).status_code == 200

    async def last_used() -> str | None:
        return (await client.get("/api/api-keys", headers=console)).json()["items"][0]["last_used_at"]

    deadline = time.monotonic() + 30
    while (seen := await last_used()) is None:
        assert time.monotonic() < deadline, "the admitted call never moved last_used_at"
        await asyncio.sleep(0.2)
    moved = datetime.fromisoformat(seen)
    assert started - timedelta(seconds=1) <= moved < future  # the admitted call's time, not the refused ones'

    # and an admitted call's event (no error_code) with the future time does move it
    await publish_call(None, 200)
    while (seen := await last_used()) != future.isoformat().replace("+00:00", "Z") and datetime.fromisoformat(seen) != future:
        assert time.monotonic() < deadline, seen
        await asyncio.sleep(0.2)


async def test_a_logout_stays_in_force_after_the_ttl_is_shortened_and_the_platform_restarts(fresh_settings):
    """Issue #41, item 3: the restarted edge forgets logouts older than the *new* TTL, so a session
    issued under the old, longer one must end by the new one too."""
    settings = fresh_settings  # restarts its platform with other settings: not the module's
    async with running_app(settings) as (_app, client):
        account, console = await signup(client)
        assert (await client.post("/api/auth/logout", headers=console)).status_code == 204
        other = bearer((await _login(client, account["email"], PASSWORD)).json()["access_token"])
    await asyncio.sleep(4)
    shortened = settings.model_copy(update={"session_ttl_seconds": 3})
    async with running_app(shortened) as (_app, client):
        for headers in (console, other):  # logged out, and merely issued 4 s ago: both past the new TTL
            refused = await client.get("/api/account", headers=headers)
            assert (refused.status_code, code(refused)) == (401, "invalid_session")
        fresh = await _login(client, account["email"], PASSWORD)
        assert fresh.json()["expires_in"] == 3
        assert (await client.get("/api/account", headers=bearer(fresh.json()["access_token"]))).status_code == 200


async def test_a_credential_with_a_byte_that_is_not_ascii_is_a_quiet_401(client, caplog):
    """Issue #41, item 4: it was a 500 with a traceback (hmac.compare_digest on a str not ASCII)."""
    _, console = await signup(client)
    calls = [
        ("GET", "/api/account", b"tg1.abc.d\xe9f", 401, "invalid_session"),
        ("POST", "/api/auth/logout", console["Authorization"].encode()[7:-1] + b"\xe9", 401, "invalid_session"),
        ("GET", "/api/geo/projects", b"sk-" + b"\xe9" * 43, 401, "invalid_api_key"),
        ("POST", "/api/usage/events", b"st-" + b"\xe9" * 43, 401, "invalid_service_token"),
        ("GET", "/api/admin/service-tokens", b"admin-\xe9", 403, "permission_denied"),
    ]
    with caplog.at_level(logging.WARNING):
        for method, path, token, status, error in calls:
            response = await client.request(method, path, headers={"Authorization": b"Bearer " + token}, json={})
            assert (response.status_code, code(response)) == (status, error), (path, response.text)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert (await client.get("/api/account", headers=console)).status_code == 200


async def test_a_password_change_racing_a_login_with_the_old_password_ends_that_login(client, monkeypatch):
    """(review) A change that comes while a login with the old password holds its checked row (the
    check passed, the session not issued yet) ends that session too: the login took its time under
    the row's lock, and the change takes its own only after it. Before, the change committed
    meanwhile and the session, issued after it, outlived the password it was opened with."""
    account, console = await signup(client)
    check = KeysTx.keep_password_hash
    change: list[asyncio.Task] = []

    async def change_lands_during_the_check(tx: KeysTx, user_id, verified_hash, rehashed):
        kept = await check(tx, user_id, verified_hash, rehashed)
        if str(user_id) == account["id"] and not change:
            body = {"current_password": PASSWORD, "new_password": NEW_PASSWORD}
            change.append(asyncio.create_task(client.put("/api/account/password", json=body, headers=console)))
            await asyncio.wait([change[0]], timeout=2)  # done before the fix; waits for the login's lock after
        return kept

    monkeypatch.setattr(KeysTx, "keep_password_hash", change_lands_during_the_check)
    login = await _login(client, account["email"], PASSWORD)
    assert login.status_code == 200, login.text
    assert (await change[0]).status_code == 204
    refused = await client.get("/api/account", headers=bearer(login.json()["access_token"]))
    assert (refused.status_code, code(refused)) == (401, "invalid_session")
