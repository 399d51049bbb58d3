"""(v4) A refusal by a key's own rules (403 ip_not_allowed, route_not_allowed, model_not_allowed)
on the shared store (real redis, several replicas' limiter): judged before the rate limit, it
still carries X-RateLimit-* (every API-key response does, API.md), on a route, through verify and
through authorize. It takes nothing, neither a rate-limit token (the key's or its account's) nor
an api_calls admission: its headers come from a read-only look at the limiter (`peek`), which
is still the strict revocation check (401 before the 403)."""

import uuid
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from services.edge.edge import Edge
from services.edge.rate_store import KeyCheck
from tests.integration.test_edge_verify import AUTHORIZE, GEO, VERIFY, service_token
from tests.integration.test_keys_api import bearer, code, new_key, signup

pytestmark = pytest.mark.integration
OFFICE = ["198.51.100.0/24"]  # the test client (127.0.0.1) is outside it


@pytest.fixture
def settings(module_settings):
    return module_settings


@pytest.fixture
def app_client(module_app_client):
    """Each test signs up an account of its own: one platform for the module."""
    return module_app_client


def limit_headers(answer) -> tuple[str, str, bool]:  # type: ignore[no-untyped-def]
    """(Limit, Remaining, whether a Reset is there) and no Retry-After: waiting would not admit a 403."""
    assert "retry-after" not in answer.headers, answer.headers
    return answer.headers["x-ratelimit-limit"], answer.headers["x-ratelimit-remaining"], "x-ratelimit-reset" in answer.headers


async def test_a_refusal_by_the_keys_rules_carries_the_shared_limiters_headers_and_takes_nothing(app_client, settings):
    app, client = app_client
    edge: Edge = app.state.runtime.edge
    assert edge.shared is not None  # the shared store: real redis
    account, owner = await signup(client)
    key = await new_key(client, owner, allowed_ips=OFFICE, rate_limit={"per_second": 0.01, "burst": 3, "per_minute": 100})
    token = await service_token(client, settings, ["keys:verify"], name=f"gw-{uuid.uuid4().hex[:6]}")
    ingress = {"X-Tollgate-Service-Token": token, **bearer(key["key"]), "X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/v1/x"}

    def verify(ip: str) -> dict[str, str]:
        return {"key": key["key"], "method": "GET", "path": "/v1/x", "ip": ip}

    routed = await client.get(GEO, headers=bearer(key["key"]))
    assert (routed.status_code, code(routed)) == (403, "ip_not_allowed")
    assert limit_headers(routed) == ("3", "3", True)  # the key's burst binds, whole: this call took nothing
    verified = (await client.post(VERIFY, json=verify("192.0.2.1"), headers=bearer(token))).json()
    assert (verified["code"], verified["status"], verified["retry_after"]) == ("ip_not_allowed", 403, None)
    assert (verified["rate_limit"]["limit"], verified["rate_limit"]["remaining"]) == (3, 3)
    authorized = await client.get(AUTHORIZE, headers=ingress)
    assert (authorized.status_code, code(authorized)) == (403, "ip_not_allowed")
    assert limit_headers(authorized) == ("3", "3", True)
    # the key's calls within its rules have its whole burst, then its 429
    within = [(await client.post(VERIFY, json=verify("198.51.100.7"), headers=bearer(token))).json() for _ in range(4)]
    assert [(w["code"], w["rate_limit"]["remaining"]) for w in within] == [
        ("valid", 2),
        ("valid", 1),
        ("valid", 0),
        ("rate_limited", 0),
    ]
    # over its rate limit too: still the 403 (the key's rules come first), from the limiter's copy
    again = await client.get(GEO, headers=bearer(key["key"]))
    assert (again.status_code, code(again), limit_headers(again)) == (403, "ip_not_allowed", ("3", "0", True))
    # only the admitted calls took an api_calls admission (money: refused calls are not paid)
    view = edge.quota.calls_view(uuid.UUID(account["id"]), datetime.now(UTC))
    assert await edge.shared.admitted(view) == 3


async def test_a_flood_outside_a_keys_addresses_spends_neither_its_rate_limit_nor_its_accounts(app_client, settings):
    """A leaked IP-restricted key used from elsewhere is inert there: however many its refusals
    (past the key's burst and the account's, on every replica's shared store), the account's
    other keys and the key's own callers keep their whole rate limits."""
    app, client = app_client
    edge: Edge = app.state.runtime.edge
    assert edge.shared is not None
    account, owner = await signup(client)
    key = await new_key(client, owner, allowed_ips=OFFICE, rate_limit={"per_second": 0.01, "burst": 5, "per_minute": 100})
    other = await new_key(client, owner)  # no rules: the plan's limit (free: burst 20)
    token = await service_token(client, settings, ["keys:verify"], name=f"gw-{uuid.uuid4().hex[:6]}")
    ingress = {"X-Tollgate-Service-Token": token, **bearer(key["key"]), "X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/v1/x"}
    outside = {"key": key["key"], "method": "GET", "path": "/v1/x", "ip": "192.0.2.1"}
    # 30 calls from outside its addresses: past the key's burst (5) and the account's (20)
    routed = [await client.get(GEO, headers=bearer(key["key"])) for _ in range(10)]
    routed += [await client.get(AUTHORIZE, headers=ingress) for _ in range(10)]
    verified = [(await client.post(VERIFY, json=outside, headers=bearer(token))).json() for _ in range(10)]
    assert {(r.status_code, code(r), r.headers["x-ratelimit-remaining"]) for r in routed} == {(403, "ip_not_allowed", "5")}
    assert {(v["status"], v["code"], v["rate_limit"]["remaining"]) for v in verified} == {(403, "ip_not_allowed", 5)}
    # nothing written in the shared store for the account or the key: no slot, no admission
    redis = Redis.from_url(settings.redis_url)
    try:
        assert await redis.exists(f"tollgate:rl:a:{account['id']}", f"tollgate:rl:k:{key['id']}") == 0
    finally:
        await redis.aclose()
    view = edge.quota.calls_view(uuid.UUID(account["id"]), datetime.now(UTC))
    assert await edge.shared.admitted(view) == 0
    # the account's whole burst for its other key, then the key's own whole burst from its office
    others = await client.get(GEO, headers=bearer(other["key"]))
    assert others.status_code == 200 and others.headers["x-ratelimit-limit"] == "20"
    assert others.headers["x-ratelimit-remaining"] == "19"
    inside = (await client.post(VERIFY, json={**outside, "ip": "198.51.100.7"}, headers=bearer(token))).json()
    assert (inside["code"], inside["rate_limit"]["limit"], inside["rate_limit"]["remaining"]) == ("valid", 5, 4)


async def test_a_revoked_keys_status_comes_before_its_rules_on_every_replica(app_client, settings):
    """The round trip a key-rule refusal makes asks the store whether the key was revoked after
    the state this replica judged it by (as the keys service's toggle writes it): the 401 its
    state will say, as the contract's order has it (status, then the key's rules), not the 403."""
    app, client = app_client
    edge: Edge = app.state.runtime.edge
    assert edge.shared is not None
    _, owner = await signup(client)
    key = await new_key(client, owner, allowed_ips=OFFICE)
    token = await service_token(client, settings, ["keys:verify"], name=f"gw-{uuid.uuid4().hex[:6]}")
    assert code(await client.get(GEO, headers=bearer(key["key"]))) == "ip_not_allowed"
    state = edge.keys.by_id(uuid.UUID(key["id"]))
    assert state is not None
    # another replica's toggle (this one's keys.v1 projection does not have it yet)
    await edge.shared.revoke(KeyCheck(state.key_id, state.version + 1), how="disabled")
    routed = await client.get(GEO, headers=bearer(key["key"]))
    assert (routed.status_code, code(routed)) == (401, "api_key_disabled")
    body = {"key": key["key"], "method": "GET", "path": "/v1/x", "ip": "192.0.2.1"}
    verified = (await client.post(VERIFY, json=body, headers=bearer(token))).json()
    assert (verified["code"], verified["status"]) == ("api_key_disabled", 401)
