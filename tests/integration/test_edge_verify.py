"""(v3) verify and authorize on real Kafka, Postgres and redis: a platform service outside Tollgate
gets exactly the decision a protected route gets (one table of cases through both), a valid
answer is an admitted, metered call naming the service, and every credential or body that is not
a decision is refused with the contract's error."""

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer

from contracts.common import Resource
from contracts.topics import CALLS
from tests.integration.test_keys_api import bearer, code, new_key, signup
from tests.integration.test_members import add, login
from tests.support.metering import wait_until
from tests.support.service_tokens import ADMIN_PATH, admin_headers

pytestmark = pytest.mark.integration
VERIFY = "/api/edge/verify"
AUTHORIZE = "/api/edge/authorize"
GEO = "/api/geo/projects"
MEMBERS = "/api/account/members"


@pytest.fixture
def settings(module_settings):
    return module_settings


@pytest.fixture
def app_client(module_app_client):
    """Each test signs up accounts of its own (the overloaded case gives back every place of the
    lane it takes): one platform for the module (conftest.module_app_client)."""
    return module_app_client


async def service_token(client: httpx.AsyncClient, settings: Any, scopes: list[str], name: str = "ai-gateway") -> str:
    made = await client.post(ADMIN_PATH, json={"name": name, "scopes": scopes}, headers=admin_headers(settings))
    assert made.status_code == 201, made.text
    return str(made.json()["token"])


def ask(key: str, **extra: Any) -> dict[str, Any]:
    """verify's body for the call a protected GEO create would be."""
    body = {"key": key, "method": "POST", "path": GEO, "ip": "203.0.113.7", "user_agent": "verify-test/1.0"}
    return {**body, "permission": "projects:write", "resource": "geo_projects", **extra}


async def route_and_verify(client: httpx.AsyncClient, service: dict[str, str], key: str) -> tuple[tuple[int, str], dict]:
    """The same call through the protected route and through verify: (status, code) of each."""
    routed = await client.post(GEO, json={"name": f"p-{uuid.uuid4().hex[:6]}"}, headers=bearer(key))
    routed_code = "valid" if routed.status_code < 300 else code(routed)
    answer = await client.post(VERIFY, json=ask(key), headers=service)
    assert answer.status_code == 200, answer.text
    return (routed.status_code if routed.status_code >= 300 else 200, routed_code), answer.json()


async def test_one_table_of_cases_through_a_protected_route_and_through_verify(app_client, settings):
    app, client = app_client
    service = bearer(await service_token(client, settings, ["keys:verify"]))
    account, owner = await signup(client)
    cases: dict[str, tuple[tuple[int, str], dict]] = {}

    valid = await new_key(client, owner)
    cases["valid"] = await route_and_verify(client, service, valid["key"])

    cases["unknown"] = await route_and_verify(client, service, "sk-" + uuid.uuid4().hex * 2)

    disabled = await new_key(client, owner)
    await client.post(f"/api/api-keys/{disabled['id']}/toggle", headers=owner)
    cases["disabled"] = await route_and_verify(client, service, disabled["key"])

    deleted = await new_key(client, owner)
    assert (await client.delete(f"/api/api-keys/{deleted['id']}", headers=owner)).status_code == 204
    cases["deleted"] = await route_and_verify(client, service, deleted["key"])

    expires_at = datetime.now(UTC) + timedelta(seconds=1)
    expired = await new_key(client, owner, expires_at=expires_at.isoformat())
    await asyncio.sleep(max(0.0, (expires_at - datetime.now(UTC)).total_seconds()) + 0.05)
    cases["expired"] = await route_and_verify(client, service, expired["key"])

    # A developer's key acts with the developer's current role: demoted to viewer, it may not write.
    developer = await add(client, owner, "developer")
    developers_key = await new_key(client, await login(client, developer["email"]))
    demoted = await client.put(f"{MEMBERS}/{developer['id']}/role", json={"role": "viewer"}, headers=owner)
    assert demoted.status_code == 200, demoted.text
    cases["viewer"] = await route_and_verify(client, service, developers_key["key"])

    # (v4) A key's own restrictions: the route's caller (the test client, 127.0.0.1) and verify's
    # `ip` (203.0.113.7) are both outside its addresses; POST is outside its routes.
    elsewhere = await new_key(client, owner, allowed_ips=["198.51.100.0/24", "2001:db8::/32"])
    cases["ip_not_allowed"] = await route_and_verify(client, service, elsewhere["key"])
    read_only = await new_key(client, owner, allowed_routes=["GET /api/geo/*", f"GET {GEO}"])
    cases["route_not_allowed"] = await route_and_verify(client, service, read_only["key"])
    # Its own rate limit, narrower than the free plan's burst of 20: the third call is refused,
    # and the headers tell the key's limit, the one that binds.
    slow = await new_key(client, owner, rate_limit={"per_second": 0.01, "burst": 2, "per_minute": 100})
    assert [(await client.get(GEO, headers=bearer(slow["key"]))).status_code for _ in range(2)] == [200, 200]
    limited = await client.get(GEO, headers=bearer(slow["key"]))
    assert limited.status_code == 429 and limited.headers["X-RateLimit-Limit"] == "2"
    cases["key_rate_limited"] = await route_and_verify(client, service, slow["key"])

    # The free plan's three GEO projects (the valid case made one): the gate refuses a fourth.
    for _ in range(2):
        assert (await client.post(GEO, json={"name": "more"}, headers=owner)).status_code == 201
    edge = app.state.runtime.edge
    account_id = uuid.UUID(account["id"])
    await wait_until(lambda: _true(edge.quota.is_blocked(account_id, Resource.GEO_PROJECTS, datetime.now(UTC))))
    cases["exhausted"] = await route_and_verify(client, service, valid["key"])

    # Overloaded: every place of the admitted lane is taken.
    taken = 0
    while edge.calls.reserve():
        taken += 1
    try:
        cases["overloaded"] = await route_and_verify(client, service, valid["key"])
    finally:
        for _ in range(taken):
            edge.calls.release()

    # Rate-limited: the free key's burst spent on the route, then one more call each way.
    other = await new_key(client, owner)
    for _ in range(200):
        if (await client.get(GEO, headers=bearer(other["key"]))).status_code == 429:
            break
    cases["rate_limited"] = await route_and_verify(client, service, other["key"])

    expected = {
        "valid": (200, "valid"),
        "unknown": (401, "invalid_api_key"),
        "disabled": (401, "api_key_disabled"),
        "deleted": (401, "invalid_api_key"),
        "expired": (401, "api_key_expired"),
        "viewer": (403, "permission_denied"),
        "exhausted": (403, "insufficient_quota"),
        "overloaded": (503, "overloaded"),
        "rate_limited": (429, "rate_limited"),
        "ip_not_allowed": (403, "ip_not_allowed"),
        "route_not_allowed": (403, "route_not_allowed"),
        "key_rate_limited": (429, "rate_limited"),
    }
    for name, ((status, route_code), answer) in cases.items():
        assert (status, route_code) == expected[name], name
        assert (answer["status"], answer["code"]) == expected[name], (name, answer)
        assert answer["valid"] is (name == "valid")
        assert (answer["error"] is None) is (name == "valid")
        if answer["error"] is not None:
            assert answer["error"]["error"]["code"] == answer["code"]

    answer = cases["valid"][1]
    assert answer["account_id"] == account["id"] and answer["api_key_id"] == valid["id"]
    assert answer["role"] == "owner" and answer["plan"] == "free"
    assert answer["rate_limit"]["limit"] > 0 and answer["quota"]["resource"] == "geo_projects"
    for unknown in ("unknown", "deleted"):  # no existence leak
        assert cases[unknown][1]["account_id"] is None and cases[unknown][1]["api_key_id"] is None
    assert cases["rate_limited"][1]["retry_after"] >= 1
    assert cases["key_rate_limited"][1]["rate_limit"]["limit"] == 2  # the key's own burst binds
    assert cases["ip_not_allowed"][1]["api_key_id"] == elsewhere["id"]  # a known key's refusal: attributed
    exhausted = cases["exhausted"][1]
    assert exhausted["error"]["error"]["details"]["resource"] == "geo_projects"
    assert exhausted["quota"]["status"] == "exhausted" and exhausted["quota"]["remaining"] == 0


async def _true(value: bool) -> bool:
    return value


async def call_events(settings: Any, account_id: str, count: int) -> list[dict]:
    """The account's first `count` calls.v1 events, read from Kafka."""
    consumer = AIOKafkaConsumer(
        settings.topic(CALLS.name), bootstrap_servers=settings.kafka_bootstrap_servers, auto_offset_reset="earliest"
    )
    await consumer.start()
    seen: list[dict] = []
    try:

        async def enough() -> bool:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                seen.extend(e for e in (json.loads(r.value) for r in records) if e["account_id"] == account_id)
            return len(seen) >= count

        await wait_until(enough, timeout=20)
    finally:
        await consumer.stop()
    return seen


async def test_a_valid_answer_is_a_metered_call_naming_the_service_and_a_refusal_counts_nothing(app_client, settings):
    app, client = app_client
    service = bearer(await service_token(client, settings, ["keys:verify", "usage:write"], name="content-service"))
    account, owner = await signup(client)
    key = await new_key(client, owner)
    edge = app.state.runtime.edge
    account_id = uuid.UUID(account["id"])
    body = {"key": key["key"], "method": "POST", "path": "/v1/articles/{id}/publish", "ip": "2001:db8::7"}
    answer = (await client.post(VERIFY, json=body, headers=service)).json()
    assert answer["valid"] is True and answer["quota"] is None
    # a flow's cost past what is left is refused, and gates without counting
    costly = {**body, "resource": "ai_tokens", "cost": 10**12}
    refused = (await client.post(VERIFY, json=costly, headers=service)).json()
    assert (refused["status"], refused["code"]) == (403, "insufficient_quota")

    events = sorted(await call_events(settings, account["id"], 2), key=lambda e: e["status"])
    assert [(e["status"], e.get("error_code")) for e in events] == [(200, None), (403, "insufficient_quota")]
    assert all(e["service"] == "content-service" for e in events)
    assert events[0]["path"] == "/v1/articles/{id}/publish" and events[0]["ip"] == "2001:db8::7"

    async def counted() -> bool:  # quota counts the one admitted call, not the refusal
        state = edge.quota.get(account_id, Resource.API_CALLS)
        return state is not None and state.used == 1

    await wait_until(counted, timeout=20)

    async def logged() -> list[dict]:  # the activity log names the service and its route
        items = (await client.get("/api/activity-log", headers=owner)).json()["items"]
        return items if len(items) == 2 else []

    items = sorted(await wait_until(logged, timeout=30), key=lambda i: i["status"])
    assert [(i["status"], i["service"], i["path"]) for i in items] == [
        (200, "content-service", "/v1/articles/{id}/publish"),
        (403, "content-service", "/v1/articles/{id}/publish"),
    ]
    csv = await client.get("/api/activity-log", headers={**owner, "Accept": "text/csv"})
    assert ",service," in csv.text.splitlines()[0] and "content-service" in csv.text


async def test_what_is_not_a_decision(client, settings):
    _, owner = await signup(client)
    key = await new_key(client, owner)
    verifier = bearer(await service_token(client, settings, ["keys:verify"]))
    writer = bearer(await service_token(client, settings, ["usage:write"], name="writer"))
    body = ask(key["key"])

    # the service's own token missing is no decision: never the caller's `missing_credentials`
    for nothing in ({}, {"Authorization": "Basic c2VydmljZQ=="}):
        missing = await client.post(VERIFY, json=body, headers=nothing)
        assert (missing.status_code, code(missing)) == (401, "invalid_service_token")
    revoked = await client.post(VERIFY, json=body, headers=bearer("st-" + "x" * 43))
    assert (revoked.status_code, code(revoked)) == (401, "invalid_service_token")
    for customer in (bearer(key["key"]), owner, writer):  # a customer's key or session; a token without the scope
        denied = await client.post(VERIFY, json=body, headers=customer)
        assert (denied.status_code, code(denied)) == (403, "permission_denied")
    for bad in (
        {**body, "path": "/" + "a" * 600},
        {**body, "path": "no-slash"},
        {**body, "path": "/with space"},
        {**body, "method": "GET /x"},
        {**body, "method": "get"},
        {**body, "ip": "not-an-ip"},
        {**body, "cost": 10**12 + 1},
        {**body, "cost": -1},
        {**body, "permission": "root:all"},
        {**body, "resource": "gold"},
        {k: v for k, v in body.items() if k != "key"},
        {**body, "surprise": 1},
    ):
        invalid = await client.post(VERIFY, json=bad, headers=verifier)
        assert (invalid.status_code, code(invalid)) == (422, "validation_error"), bad
    assert (await client.post(VERIFY, content=b"{", headers={**verifier, "content-type": "application/json"})).status_code == 422
    # a session token handed to verify is no API key: never admitted
    session = owner["Authorization"].split(" ", 1)[1]
    answer = (await client.post(VERIFY, json=ask(session), headers=verifier)).json()
    assert (answer["valid"], answer["code"]) == (False, "invalid_api_key")
    empty = (await client.post(VERIFY, json=ask(""), headers=verifier)).json()
    assert (empty["status"], empty["code"]) == (401, "missing_credentials")


async def test_authorize_answers_an_ingress_in_headers(client, settings):
    account, owner = await signup(client)
    key = await new_key(client, owner)
    token = await service_token(client, settings, ["keys:verify"], name="edge-ingress")
    ingress = {"X-Tollgate-Service-Token": token, "X-Forwarded-Method": "POST", "X-Forwarded-Uri": "/v1/chat?stream=1"}

    admitted = await client.get(AUTHORIZE, headers={**ingress, **bearer(key["key"])})
    assert admitted.status_code == 200 and admitted.content == b""
    assert admitted.headers["X-Tollgate-Account"] == account["id"]
    assert admitted.headers["X-Tollgate-Key"] == key["id"]
    assert admitted.headers["X-Tollgate-Role"] == "owner" and admitted.headers["X-Tollgate-Plan"] == "free"
    assert int(admitted.headers["X-RateLimit-Limit"]) > 0

    disabled = await new_key(client, owner)
    await client.post(f"/api/api-keys/{disabled['id']}/toggle", headers=owner)
    refused = await client.get(AUTHORIZE, headers={**ingress, **bearer(disabled["key"])})
    assert (refused.status_code, code(refused)) == (401, "api_key_disabled")
    assert refused.headers["WWW-Authenticate"] == "Bearer"
    assert refused.headers["X-Tollgate-Status"] == "401"
    assert json.loads(refused.headers["X-Tollgate-Error"]) == refused.json()
    assert "X-Tollgate-Account" not in refused.headers

    nothing = await client.get(AUTHORIZE, headers=ingress)
    assert (nothing.status_code, code(nothing)) == (401, "missing_credentials")

    quota = await client.get(AUTHORIZE, headers={**ingress, **bearer(key["key"]), "X-Tollgate-Resource": "ai_tokens",
                                                  "X-Tollgate-Cost": str(10**12)})  # fmt: skip
    assert (quota.status_code, code(quota)) == (403, "insufficient_quota")
    assert quota.json()["error"]["details"]["resource"] == "ai_tokens"

    for problem, expected in (({}, 401), ({"X-Tollgate-Service-Token": "st-" + "y" * 43}, 401)):
        headers = {k: v for k, v in ingress.items() if k != "X-Tollgate-Service-Token"} | problem | bearer(key["key"])
        misconfigured = await client.get(AUTHORIZE, headers=headers)
        assert (misconfigured.status_code, code(misconfigured)) == (expected, "invalid_service_token")
        assert misconfigured.headers["X-Tollgate-Ingress-Error"] == "1"
    writer = await service_token(client, settings, ["usage:write"], name="writer")
    scoped = await client.get(AUTHORIZE, headers={**ingress, "X-Tollgate-Service-Token": writer, **bearer(key["key"])})
    assert (scoped.status_code, code(scoped)) == (403, "permission_denied")
    assert scoped.headers["X-Tollgate-Ingress-Error"] == "1"

    absurd = await client.get(AUTHORIZE, headers={**ingress, **bearer(key["key"]), "X-Forwarded-Uri": "x" * 10})
    assert (absurd.status_code, code(absurd)) == (422, "validation_error")


async def test_authorize_in_envoys_shape_takes_the_method_and_the_path_after_the_prefix(app_client, settings):
    _, client = app_client
    account, owner = await signup(client)
    key = await new_key(client, owner)
    token = await service_token(client, settings, ["keys:verify"], name="envoy")
    headers = {"X-Tollgate-Service-Token": token, **bearer(key["key"])}
    admitted = await client.post(f"{AUTHORIZE}/v1/chat/completions?stream=true", headers=headers)
    assert admitted.status_code == 200 and admitted.headers["X-Tollgate-Key"] == key["id"]
    (event,) = await call_events(settings, account["id"], 1)  # the original method and path
    assert (event["method"], event["path"], event["service"]) == ("POST", "/v1/chat/completions", "envoy")
    await client.post(f"/api/api-keys/{key['id']}/toggle", headers=owner)
    refused = await client.delete(f"{AUTHORIZE}/v1/files/1", headers=headers)
    assert (refused.status_code, code(refused)) == (401, "api_key_disabled")


async def test_verify_and_authorize_judge_the_model_the_service_will_call(app_client, settings):
    """(v4) `model` (verify) and `X-Tollgate-Model` (authorize): a model outside the key's
    allowed ones, or none at all, is 403 model_not_allowed, logged and not counted; Tollgate's own
    routes call no model and are not judged by it."""
    app, client = app_client
    service = bearer(await service_token(client, settings, ["keys:verify"]))
    account, owner = await signup(client)
    key = await new_key(client, owner, allowed_models=["openai/gpt-4o-mini", "anthropic/*"])
    body = {"key": key["key"], "method": "POST", "path": "/v1/chat/completions", "ip": "203.0.113.7"}

    async def verdict(**extra: Any) -> str:
        answer = await client.post(VERIFY, json={**body, **extra}, headers=service)
        assert answer.status_code == 200, answer.text
        return str(answer.json()["code"])

    assert await verdict(model="openai/gpt-4o-mini") == "valid"
    assert await verdict(model="anthropic/claude-3-5-haiku") == "valid"
    assert await verdict(model="openai/gpt-4o") == "model_not_allowed"
    assert await verdict() == "model_not_allowed"  # fail closed: no model named
    assert (await client.post(VERIFY, json={**body, "model": "no-provider"}, headers=service)).status_code == 422

    ingress = {
        "X-Tollgate-Service-Token": service["Authorization"].removeprefix("Bearer "),
        "Authorization": f"Bearer {key['key']}",
        "X-Forwarded-Method": "POST",
        "X-Forwarded-Uri": "/v1/chat/completions?model=openai/gpt-4o-mini",  # the query names no model Tollgate judges
    }
    refused = await client.get(AUTHORIZE, headers={**ingress, "X-Tollgate-Model": "openai/gpt-4o"})
    assert (refused.status_code, code(refused)) == (403, "model_not_allowed")
    assert refused.headers["X-Tollgate-Status"] == "403"
    admitted = await client.get(AUTHORIZE, headers={**ingress, "X-Tollgate-Model": "openai/gpt-4o-mini"})
    assert admitted.status_code == 200 and admitted.headers["X-Tollgate-Key"] == key["id"]
    assert (await client.get("/api/account", headers=bearer(key["key"]))).status_code == 200

    events = await call_events(settings, account["id"], 7)
    refusals = sorted(e.get("error_code") for e in events if e.get("error_code"))
    assert refusals == ["model_not_allowed"] * 3

    async def counted() -> bool:  # the admitted calls only: 2 verify, 1 authorize, 1 route
        state = app.state.runtime.edge.quota.get(uuid.UUID(account["id"]), Resource.API_CALLS)
        return state is not None and state.used == 4

    await wait_until(counted, timeout=20)
