"""(v4) A refusal by a key's own rules (403 ip_not_allowed, route_not_allowed, model_not_allowed)
on the shared store (real redis, several replicas' limiter): judged before the rate limit, it
still carries X-RateLimit-* (every API-key response does, API.md), on a route, through verify and
through authorize. It takes a rate-limit token like any call of the key, never an api_calls
admission, and the store's round trip that takes it is the strict revocation check too."""

import uuid
from datetime import UTC, datetime

import pytest

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


async def test_a_refusal_by_the_keys_rules_carries_the_shared_limiters_headers_and_admits_nothing(app_client, settings):
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
    assert limit_headers(routed) == ("3", "2", True)  # the key's burst binds; this call took a token
    verified = (await client.post(VERIFY, json=verify("192.0.2.1"), headers=bearer(token))).json()
    assert (verified["code"], verified["status"], verified["retry_after"]) == ("ip_not_allowed", 403, None)
    assert (verified["rate_limit"]["limit"], verified["rate_limit"]["remaining"]) == (3, 1)
    authorized = await client.get(AUTHORIZE, headers=ingress)
    assert (authorized.status_code, code(authorized)) == (403, "ip_not_allowed")
    assert limit_headers(authorized) == ("3", "0", True)
    # over its rate limit too: still the 403 (the key's rules come first), from the limiter's copy
    again = await client.get(GEO, headers=bearer(key["key"]))
    assert (again.status_code, code(again), limit_headers(again)) == (403, "ip_not_allowed", ("3", "0", True))
    # the tokens were taken in the shared store: a call within the rules is now the limiter's 429
    within = (await client.post(VERIFY, json=verify("198.51.100.7"), headers=bearer(token))).json()
    assert (within["code"], within["status"]) == ("rate_limited", 429) and within["retry_after"] >= 1
    # and no api_calls admission was ever taken for the account (money: refused calls are not paid)
    view = edge.quota.calls_view(uuid.UUID(account["id"]), datetime.now(UTC))
    assert await edge.shared.admitted(view) == 0


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
