"""The audit log (API.md, "Audit log (v2)") against real Kafka and Postgres, one platform for the
module: every console, API-key and operator write lands once with its actor, target, address and
user agent (through each service's outbox and audit.v1); filters and keyset paging; who may read
it; another account's entries never show; a replayed event is stored once; the table refuses
UPDATE and DELETE."""

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from aiokafka import AIOKafkaProducer

from contracts.audit import PLATFORM_ACCOUNT, AuditAction, AuditContext
from contracts.topics import AUDIT
from services.runtime.platform.settings import Settings
from tests.integration.quota_helpers import eventually
from tests.integration.test_keys_api import PASSWORD, bearer, code, new_key, signup
from tests.integration.test_members import add, login
from tests.support.apps import running_app

pytestmark = pytest.mark.integration
AUDIT_LOG = "/api/audit-log"
CLIENT_IP = "203.0.113.7"  # X-Forwarded-For, believed from the trusted loopback peer
UA = "audit-test/1.0"


def _from(headers: dict[str, str]) -> dict[str, str]:
    return {**headers, "User-Agent": UA, "X-Forwarded-For": CLIENT_IP}


@pytest.fixture(scope="module")
async def platform(module_settings: Settings) -> AsyncIterator[tuple[Settings, httpx.AsyncClient]]:
    settings = module_settings.model_copy(update={"trusted_proxies": ["127.0.0.0/8"]})
    async with running_app(settings) as (_, client):
        yield settings, client


@pytest.fixture
def client(platform: tuple[Settings, httpx.AsyncClient]) -> httpx.AsyncClient:
    return platform[1]


async def entries(client: httpx.AsyncClient, headers: dict[str, str], count: int, **query: Any) -> list[dict]:
    """The account's entries once `count` of them have arrived (they travel outbox -> audit.v1)."""

    async def arrived() -> list[dict] | None:
        response = await client.get(AUDIT_LOG, params={"limit": 200, **query}, headers=headers)
        assert response.status_code == 200, response.text
        items: list[dict] = response.json()["items"]
        return items if len(items) >= count else None

    items = await eventually(arrived)
    assert len(items) == count, [i["action"] for i in items]
    return items


async def test_every_write_is_recorded_once_with_its_actor_target_and_address(client: httpx.AsyncClient, platform):
    settings = platform[0]
    account, owner = await signup(client)
    me, owner = account["id"], _from(owner)
    key = await new_key(client, owner, name="ci")
    assert (await client.post(f"/api/api-keys/{key['id']}/toggle", headers=owner)).status_code == 200
    rotated = await client.post(f"/api/api-keys/{key['id']}/rotate", json={"grace_seconds": 0}, headers=owner)
    assert rotated.status_code == 201
    assert (await client.delete(f"/api/api-keys/{rotated.json()['id']}", headers=owner)).status_code == 204
    member = await add(client, owner, "developer")
    assert (
        await client.put(f"/api/account/members/{member['id']}/role", json={"role": "viewer"}, headers=owner)
    ).status_code == 200
    assert (await client.delete(f"/api/account/members/{member['id']}", headers=owner)).status_code == 204
    assert (await client.put("/api/account/user-type", json={"user_type": "enterprise"}, headers=owner)).status_code == 200
    package = {"kind": "quota_package", "package": {"resource": "ai_tokens", "amount": 100_000}}
    order = (await client.post("/api/billing/orders", json=package, headers=owner)).json()
    assert (await client.post(f"/api/billing/orders/{order['id']}/pay", headers=owner)).status_code == 200
    upgrade = await client.post("/api/billing/subscription/switch", json={"plan": "basic"}, headers=owner)
    assert upgrade.status_code == 402
    upgrade_id = upgrade.json()["error"]["details"]["order"]["id"]
    assert (await client.post(f"/api/billing/orders/{upgrade_id}/pay", headers=owner)).status_code == 200
    assert (await client.post("/api/billing/subscription/switch", json={"plan": "free"}, headers=owner)).status_code == 200
    sdk = await new_key(client, owner, name="sdk")
    as_key = {**bearer(sdk["key"]), "User-Agent": "sdk/2", "X-Forwarded-For": "198.51.100.20"}
    rule = await client.post(
        "/api/ai/usage/alert", json={"metric": "total_tokens", "threshold_pct": 80, "channels": ["in_site"]}, headers=as_key
    )
    assert rule.status_code == 201, rule.text
    assert (await client.delete(f"/api/ai/usage/alert/{rule.json()['id']}", headers=as_key)).status_code == 204
    new_password = "another horse battery"
    changed = await client.put(
        "/api/account/password", json={"current_password": PASSWORD, "new_password": new_password}, headers=owner
    )
    assert changed.status_code == 204
    relogin = await client.post("/api/auth/login", json={"email": account["email"], "password": new_password})
    owner = _from(bearer(relogin.json()["access_token"]))
    second = await client.post("/api/auth/login", json={"email": account["email"], "password": new_password})
    assert (await client.post("/api/auth/logout", headers=_from(bearer(second.json()["access_token"])))).status_code == 204
    admin = {"Authorization": f"Bearer {settings.admin_token.get_secret_value()}", "User-Agent": "ops-cli"}
    token = (await client.post("/api/admin/service-tokens", json={"name": "gw"}, headers=admin)).json()
    assert (await client.delete(f"/api/admin/service-tokens/{token['id']}", headers=admin)).status_code == 204
    assert (await client.delete(f"/api/admin/service-tokens/{token['id']}", headers=admin)).status_code == 204  # no second entry
    roles = await client.put(f"/api/admin/accounts/{me}/roles", json={"roles": ["owner", "billing"]}, headers=admin)
    assert roles.status_code == 200

    expected = [
        "api_key.created",
        "api_key.toggled",
        "api_key.rotated",
        "api_key.deleted",
        "member.added",
        "member.role_changed",
        "member.removed",
        "user_type.changed",
        "order.created",
        "order.paid",
        "order.created",
        "order.paid",
        "plan.switched",
        "api_key.created",
        "alert_rule.created",
        "alert_rule.deleted",
        "password.changed",
        "session.logout",
        "account.roles_changed",
    ]
    items = await entries(client, owner, len(expected))
    assert sorted(i["action"] for i in items) == sorted(expected)
    assert [i["time"] for i in items] == sorted((i["time"] for i in items), reverse=True)
    [by_operator] = [i for i in items if i["action"] == "account.roles_changed"]
    assert (by_operator["actor"], by_operator["target"], by_operator["user_agent"]) == (
        {"operator": True},
        {"type": "account", "id": me},
        "ops-cli",
    )
    assert by_operator["details"] == {"roles": ["owner", "billing"], "previous_roles": ["owner"]}
    by_console = [i for i in items if i["action"] not in ("account.roles_changed", "alert_rule.created", "alert_rule.deleted")]
    assert {(i["actor"]["user_id"], i["actor"]["email"], i["ip"], i["user_agent"]) for i in by_console} == {
        (me, account["email"], CLIENT_IP, UA)
    }
    assert all(set(i["actor"]) == {"user_id", "email"} for i in by_console)
    by_key = [i for i in items if i["action"].startswith("alert_rule.")]
    assert {(i["actor"]["api_key_id"], i["actor"]["user_id"], i["ip"], i["user_agent"]) for i in by_key} == {
        (sdk["id"], me, "198.51.100.20", "sdk/2")
    }
    assert {(i["target"]["type"], i["target"]["id"]) for i in by_key} == {("alert_rule", rule.json()["id"])}
    targets = {i["action"]: i["target"] for i in items}
    assert targets["api_key.toggled"] == {"type": "api_key", "id": key["id"]}
    assert targets["member.removed"] == {"type": "user", "id": member["id"]}
    assert targets["order.paid"]["type"] == "order" and targets["plan.switched"] == {"type": "account", "id": me}
    details = {i["action"]: i["details"] for i in items}
    assert details["member.role_changed"] == {"role": "viewer", "previous_role": "developer"}
    assert details["api_key.rotated"]["new_key_id"] == rotated.json()["id"]
    assert set(items[0]) == {"time", "actor", "action", "target", "ip", "user_agent", "details"}

    # the operator's entries are the platform's: stored, with {operator: true}, shown to no account
    async def operator_rows() -> list[tuple] | None:
        with psycopg.connect(settings.database_url) as conn:
            rows = conn.execute(
                "SELECT action, actor_operator, user_agent FROM keys.audit_log WHERE account_id = %s ORDER BY time",
                (PLATFORM_ACCOUNT,),
            ).fetchall()
        return rows if len(rows) >= 2 else None

    assert await eventually(operator_rows) == [
        ("service_token.created", True, "ops-cli"),
        ("service_token.revoked", True, "ops-cli"),
    ]


async def test_filters_and_cursor_paging(client: httpx.AsyncClient):
    _, owner = await signup(client)
    keys = [await new_key(client, owner, name=f"k{n}") for n in range(4)]
    for key in keys[:3]:
        assert (await client.post(f"/api/api-keys/{key['id']}/toggle", headers=owner)).status_code == 200
    everything = await entries(client, owner, 7)

    paged: list[dict] = []
    cursor = None
    for _ in range(10):
        params: dict[str, Any] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = (await client.get(AUDIT_LOG, params=params, headers=owner)).json()
        paged += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert paged == everything

    toggled = (await client.get(AUDIT_LOG, params={"action": "api_key.toggled"}, headers=owner)).json()["items"]
    assert [i["target"]["id"] for i in toggled] == [k["id"] for k in reversed(keys[:3])]
    middle = everything[3]["time"]
    window = {"start": middle, "end": everything[0]["time"]}
    inside = (await client.get(AUDIT_LOG, params=window, headers=owner)).json()["items"]
    assert inside == everything[1:4]
    later = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    assert (await client.get(AUDIT_LOG, params={"start": later}, headers=owner)).json() == {"items": [], "next_cursor": None}

    for bad in (
        {"start": "yesterday"},
        {"start": "2026-11-01T00:00:00"},  # no offset: which day would it be?
        {"start": later, "end": middle},
        {"limit": 0},
        {"limit": 1000},
        {"cursor": "not-a-cursor"},
        {"action": "api_key.exploded"},
    ):
        refused = await client.get(AUDIT_LOG, params=bad, headers=owner)
        assert (refused.status_code, code(refused)) == (422, "validation_error"), bad


async def test_who_may_read_it_and_another_account_sees_nothing(client: httpx.AsyncClient):
    account, owner = await signup(client)
    key = await new_key(client, owner)
    billing = await login(client, (await add(client, owner, "billing"))["email"])
    await entries(client, billing, 2)  # the billing role reads the account's log: the key, the member
    for role in ("developer", "viewer"):
        refused = await client.get(AUDIT_LOG, headers=await login(client, (await add(client, owner, role))["email"]))
        assert (refused.status_code, code(refused)) == (403, "permission_denied")
        assert refused.json()["error"]["message"]
    by_key = await client.get(AUDIT_LOG, headers=bearer(key["key"]))
    assert (by_key.status_code, code(by_key)) == (403, "console_session_required")
    nobody = await client.get(AUDIT_LOG)
    assert (nobody.status_code, code(nobody)) == (401, "missing_credentials")

    _, other = await signup(client)
    await new_key(client, other)
    [theirs] = await entries(client, other, 1)
    assert theirs["target"]["id"] != key["id"]
    mine = await entries(client, owner, 4)  # the key and three members
    assert key["id"] in {i["target"]["id"] for i in mine} and theirs not in mine
    assert account["id"] in {i["actor"]["user_id"] for i in mine}


async def test_a_replayed_event_is_stored_once_and_the_table_is_append_only(client: httpx.AsyncClient, platform):
    settings = platform[0]
    account, owner = await signup(client)
    context = AuditContext(user_id=uuid.UUID(account["id"]), ip="192.0.2.1", user_agent="replay")
    now = datetime.now(UTC)
    event = context.entry(uuid.UUID(account["id"]), now, AuditAction.API_KEY_CREATED, "api_key", uuid.uuid4())
    marker = context.entry(uuid.UUID(account["id"]), now, AuditAction.API_KEY_DELETED, "api_key", uuid.uuid4())
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers)
    await producer.start()
    try:
        topic, key = settings.topic(AUDIT.name), account["id"].encode()
        for value in (event.model_dump_json(), event.model_dump_json(), "not json", marker.model_dump_json()):
            await producer.send_and_wait(topic, value.encode(), key=key)  # one partition: in this order
    finally:
        await producer.stop()
    items = await entries(client, owner, 2)  # the marker came after the replay and the garbage
    assert sorted(i["action"] for i in items) == ["api_key.created", "api_key.deleted"]

    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM keys.audit_log WHERE id = %s", (event.id,)).fetchone() == (1,)
        for statement in ("UPDATE keys.audit_log SET ip = 'forged' WHERE id = %s", "DELETE FROM keys.audit_log WHERE id = %s"):
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                conn.execute(statement, (event.id,))
        assert conn.execute("SELECT ip FROM keys.audit_log WHERE id = %s", (event.id,)).fetchone() == ("192.0.2.1",)
