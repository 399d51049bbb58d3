"""Two accounts: every object of A answers B exactly as a object that does not exist would (404,
never 403: no existence leak), on every route that takes an id, with B's console session and
with B's API key; B's lists and analytics show nothing of A; A's objects are left untouched."""

import asyncio
import uuid
from datetime import UTC, datetime

import httpx
import pytest

from tests.hostile.helpers import Account, assert_contract_error, bearer, eventually, new_account, new_key
from tests.support.service_tokens import create_service_token, service_headers

pytestmark = pytest.mark.integration


@pytest.fixture
def settings(module_settings):
    return module_settings


@pytest.fixture
def app_client(module_app_client):
    """Each test makes its two accounts of its own: one platform for the module (conftest.module_app_client)."""
    return module_app_client


CONSOLE_ONLY = {
    "/api/api-keys/{key_id}/toggle",
    "/api/api-keys/{key_id}",
    "/api/api-keys/{key_id}/rotate",
    "/api/billing/orders/{order_id}/pay",
    "/api/billing/orders/{order_id}",
    "/api/billing/orders/{order_id}/invoice",
    "/api/account/members/{member_id}/role",
    "/api/account/members/{member_id}",
}
# method, path template -> (which of A's objects, body)
BY_ID: dict[tuple[str, str], tuple[str, dict | None]] = {
    ("POST", "/api/api-keys/{key_id}/toggle"): ("key", None),
    ("POST", "/api/api-keys/{key_id}/rotate"): ("key", {"grace_seconds": 0}),
    ("PATCH", "/api/api-keys/{key_id}"): ("key", {"allowed_models": ["openai/*"]}),  # (v4)
    ("DELETE", "/api/api-keys/{key_id}"): ("key", None),
    ("POST", "/api/billing/orders/{order_id}/pay"): ("order", None),
    ("GET", "/api/billing/orders/{order_id}"): ("order", None),
    ("GET", "/api/billing/orders/{order_id}/invoice"): ("order", None),
    ("DELETE", "/api/ai/usage/alert/{rule_id}"): ("rule", None),
    ("GET", "/api/ai/usage/alert/{rule_id}/deliveries"): ("rule", None),
    ("POST", "/api/notifications/{notification_id}/read"): ("notification", None),
    ("DELETE", "/api/geo/projects/{project_id}"): ("project", None),
    ("PUT", "/api/account/members/{member_id}/role"): ("member", {"role": "owner"}),
    ("DELETE", "/api/account/members/{member_id}"): ("member", None),
}
OPERATOR = ("PUT", "/api/admin/accounts/{account_id}/roles")
SERVICE_TOKEN_REVOKE = ("DELETE", "/api/admin/service-tokens/{token_id}")  # operator too, not the tenant's
# (v3) authorize in Envoy's shape takes a path, not an object's id, and only an ingress's service token
ENVOY_AUTHORIZE = {(m, "/api/edge/authorize/{forwarded}") for m in ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")}


def _routes_with_ids(app) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, operations in app.openapi()["paths"].items() if "{" in path for method in operations}


async def _objects_of(client, settings, a: Account) -> dict[str, str]:
    """One of every kind of object A can own, made through the public API."""
    key = await new_key(client, a, "a's key")
    rule = await client.post(
        "/api/ai/usage/alert",
        json={"metric": "total_tokens", "threshold_pct": 1, "channels": ["in_site"], "recipients": []},
        headers=a.headers,
    )
    order = await client.post("/api/billing/orders", json={"kind": "plan_upgrade", "plan": "basic"}, headers=a.headers)
    project = await client.post("/api/geo/projects", json={"name": "a's project"}, headers=a.headers)
    assert (rule.status_code, order.status_code, project.status_code) == (201, 201, 201), (rule.text, order.text, project.text)
    member_body = {
        "email": f"m{uuid.uuid4().hex[:10]}@example.com",
        "name": "a's member",
        "password": "a member password",
        "role": "viewer",
    }
    member = await client.post("/api/account/members", json=member_body, headers=a.headers)
    assert member.status_code == 201, member.text
    usage = {
        "id": str(uuid.uuid4()),
        "time": datetime.now(UTC).isoformat(),
        "account_id": a.id,
        "resource": "ai_tokens",
        "quantity": 5000,
        "provider": "openai",
        "model": "gpt-4o",
        "input_tokens": 5000,
        "output_tokens": 0,
        "source": "isolation-test",
    }
    reported = await client.post("/api/usage/events", json={"events": [usage]}, headers=await service_headers(client, settings))
    assert reported.status_code == 202
    assert (await client.get("/api/geo/projects", headers=bearer(key["key"]))).status_code == 200  # an activity entry

    async def notification() -> str | None:
        items = (await client.get("/api/notifications", headers=a.headers)).json()["items"]
        return items[0]["id"] if items else None

    async def activity() -> bool:
        return bool((await client.get("/api/activity-log", headers=a.headers)).json()["items"])

    objects = {
        "key": key["id"],
        "secret": key["key"],
        "rule": rule.json()["id"],
        "order": order.json()["id"],
        "project": project.json()["id"],
        "member": member.json()["id"],
        "notification": await eventually(notification, what="A's notification"),
    }
    await eventually(activity, what="A's activity log")
    return objects


def _same_answer(theirs, nobodys) -> None:
    """A's object and an id nobody owns look the same to B: status, code (no existence leak)."""
    assert theirs.status_code == nobodys.status_code, (theirs.text, nobodys.text)
    if theirs.status_code >= 400:
        assert theirs.json()["error"]["code"] == nobodys.json()["error"]["code"]


async def _within_rate_limit(
    client: httpx.AsyncClient, method: str, url: str, body: dict | None, headers: dict[str, str]
) -> httpx.Response:
    """B's probes of every route, twice per credential, outrun the free plan's burst: a 429 is
    waited out (Retry-After) and the probe repeated, since isolation, not the limit, is tested here."""
    for _ in range(30):
        response = await client.request(method, url, json=body, headers=headers)
        if response.status_code != 429:
            return response
        await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
    raise AssertionError(f"{method} {url}: still rate-limited after 30 waits")


async def test_every_object_of_one_account_is_invisible_to_another(app_client, settings):
    app, client = app_client
    assert _routes_with_ids(app) == set(BY_ID) | {OPERATOR, SERVICE_TOKEN_REVOKE, RESERVATION_RELEASE} | ENVOY_AUTHORIZE, (
        "a new route takes an id: add it to BY_ID"
    )

    a, b = await new_account(client), await new_account(client)
    objects = await _objects_of(client, settings, a)
    b_key = await new_key(client, b, "b's key")

    for (method, template), (kind, body) in BY_ID.items():
        for credentials in (b.headers, bearer(b_key["key"])):
            via_key = credentials is not b.headers
            own = template.replace("{" + template.split("{")[1].split("}")[0] + "}", objects[kind])
            nobody = template.replace("{" + template.split("{")[1].split("}")[0] + "}", str(uuid.uuid4()))
            theirs = await _within_rate_limit(client, method, own, body, credentials)
            nobodys = await _within_rate_limit(client, method, nobody, body, credentials)
            if via_key and template in CONSOLE_ONLY:
                assert_contract_error(theirs, 403, "console_session_required")
            else:
                assert_contract_error(theirs, 404, "not_found")
            _same_answer(theirs, nobodys)

    # The operator route is not the tenant's: B gets the same refusal for A's id and any other.
    theirs = await client.put(f"/api/admin/accounts/{a.id}/roles", json={"roles": ["viewer"]}, headers=b.headers)
    nobodys = await client.put(f"/api/admin/accounts/{uuid.uuid4()}/roles", json={"roles": ["viewer"]}, headers=b.headers)
    assert_contract_error(theirs, 403, "permission_denied")
    _same_answer(theirs, nobodys)
    token = await create_service_token(client, settings)
    for credentials in (b.headers, bearer(b_key["key"])):
        theirs = await client.delete(f"/api/admin/service-tokens/{token['id']}", headers=credentials)
        nobodys = await client.delete(f"/api/admin/service-tokens/{uuid.uuid4()}", headers=credentials)
        assert_contract_error(theirs, 403, "permission_denied")
        _same_answer(theirs, nobodys)
    assert (await client.post("/api/usage/events", json={"events": []}, headers=bearer(token["token"]))).status_code == 422

    # B cannot report usage for A, nor see A in any list or analytics.
    foreign = {
        "time": datetime.now(UTC).isoformat(),
        "account_id": a.id,
        "resource": "ai_tokens",
        "quantity": 1,
        "source": "isolation-test",
    }
    for credentials in (b.headers, bearer(b_key["key"])):  # (v2) nor for itself: usage is written by service tokens
        assert_contract_error(
            await client.post("/api/usage/events", json={"events": [foreign]}, headers=credentials), 403, "permission_denied"
        )
    seen_by_b = ""

    async def in_as_audit_log() -> bool:  # (v2) A's entries are stored before B looks for them
        return objects["rule"] in (await client.get("/api/audit-log", headers=a.headers)).text

    await eventually(in_as_audit_log, what="A's audit entries")
    for path in (
        "/api/audit-log",
        "/api/account",
        "/api/account/members",
        "/api/api-keys",
        "/api/ai/usage/alert",
        "/api/notifications",
        "/api/geo/projects",
        "/api/activity-log",
        f"/api/activity-log?api_key_id={objects['key']}",
        "/api/billing/subscription",
        "/api/billing/orders",
        "/api/ai/usage/by-provider?range=today",
        "/api/ai/usage/trend?range=today&granularity=hour&group_by=model",
    ):
        listed = await client.get(path, headers=b.headers)
        assert listed.status_code == 200, (path, listed.text)
        seen_by_b += listed.text
    for kind in ("key", "rule", "order", "project", "notification", "member"):
        assert objects[kind] not in seen_by_b, kind
    assert a.id not in seen_by_b and a.email not in seen_by_b
    overview = (await client.get("/api/ai/usage/overview?range=today", headers=b.headers)).json()
    quota = {i["resource"]: i for i in (await client.get("/api/billing/check-quota", headers=b.headers)).json()["items"]}
    assert overview["total_tokens"] == 0 and quota["ai_tokens"]["used"] == 0

    # A's objects are as they were.
    assert (await client.get("/api/geo/projects", headers=bearer(objects["secret"]))).status_code == 200  # key still enabled
    assert objects["rule"] in (await client.get("/api/ai/usage/alert", headers=a.headers)).text
    assert objects["project"] in (await client.get("/api/geo/projects", headers=a.headers)).text
    members = (await client.get("/api/account/members", headers=a.headers)).json()["items"]
    assert [m["role"] for m in members if m["id"] == objects["member"]] == ["viewer"]
    notifications = (await client.get("/api/notifications", headers=a.headers)).json()["items"]
    assert [n["read"] for n in notifications if n["id"] == objects["notification"]] == [False]
    paid = await client.post(f"/api/billing/orders/{objects['order']}/pay", headers=a.headers)
    assert paid.status_code == 200 and paid.json()["status"] == "paid"  # still A's, still pending until now


RESERVATION_RELEASE = ("DELETE", "/api/quota/reservations/{reservation_id}")  # a service route, not the tenant's


async def test_no_customer_credential_releases_a_reservation_not_even_its_own(app_client, settings):
    _app, client = app_client
    a, b = await new_account(client), await new_account(client)
    body = {"account_id": a.id, "resource": "ai_tokens", "amount": 10, "ttl_seconds": 60}
    made = await client.post("/api/quota/reservations", json=body, headers=await service_headers(client, settings))
    assert made.status_code == 201, made.text
    a_key, b_key = await new_key(client, a, "a's key"), await new_key(client, b, "b's key")
    for credentials in (a.headers, bearer(a_key["key"]), b.headers, bearer(b_key["key"])):
        theirs = await client.delete(f"/api/quota/reservations/{made.json()['id']}", headers=credentials)
        nobodys = await client.delete(f"/api/quota/reservations/{uuid.uuid4()}", headers=credentials)
        assert_contract_error(theirs, 403, "permission_denied")
        _same_answer(theirs, nobodys)
