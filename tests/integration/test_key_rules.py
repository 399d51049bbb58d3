"""(v4) A key's own rules through the keys service on real Postgres, Kafka and redis: set at
creation and with PATCH (absent unchanged, null cleared), shown on key objects, published whole on
keys.v1 and audited; every bad input is the contract's 422, and only a console session of the
key's account (a developer: its own keys) may change a key."""

import uuid

import pytest

from contracts.credentials import hash_secret
from tests.integration.test_audit_log import entries
from tests.integration.test_keys_api import bearer, code, new_key, signup
from tests.integration.test_members import add, login

pytestmark = pytest.mark.integration
KEYS = "/api/api-keys"


@pytest.fixture
def app_client(module_app_client):
    """Each test signs up accounts of its own: one platform for the module (conftest.module_app_client)."""
    return module_app_client


CI_RULES = {
    "limits": [{"resource": "ai_tokens", "amount": 50000, "period": "month"}],
    "allowed_models": ["openai/gpt-4o-mini"],
    "allowed_routes": ["POST /v1/chat/*"],
    "allowed_ips": ["198.51.100.7", "2001:db8::/32"],
    "rate_limit": {"per_second": 1, "burst": 2, "per_minute": 60},
}


async def test_rules_at_creation_in_the_list_and_patched_field_by_field(app_client):
    app, client = app_client
    _, owner = await signup(client)
    key = await new_key(client, owner, **CI_RULES)
    assert key["allowed_ips"] == ["198.51.100.7/32", "2001:db8::/32"]  # canonical CIDRs
    assert key["limits"] == CI_RULES["limits"] and key["rate_limit"] == {"per_second": 1.0, "burst": 2, "per_minute": 60}
    [listed] = (await client.get(KEYS, headers=owner)).json()["items"]
    assert {f: listed[f] for f in CI_RULES} == {f: key[f] for f in CI_RULES}

    # absent: unchanged; null: cleared; a value: replaced
    patched = await client.patch(
        f"{KEYS}/{key['id']}", json={"allowed_models": None, "allowed_routes": ["GET /v1/models"], "name": "ci-2"}, headers=owner
    )
    assert patched.status_code == 200, patched.text
    body = patched.json()
    assert body["id"] == key["id"] and body["name"] == "ci-2" and body["status"] == "enabled"
    assert body["allowed_models"] == [] and body["allowed_routes"] == ["GET /v1/models"]
    assert body["allowed_ips"] == key["allowed_ips"] and body["limits"] == key["limits"]
    # in force in this process when the PATCH answers (keys.v1 carries the rules)
    state = app.state.runtime.edge.keys.get(hash_secret(key["key"]))
    assert state is not None and state.allowed_models == [] and state.allowed_routes == ["GET /v1/models"]
    assert state.version > 1 and state.allowed_ips == key["allowed_ips"]

    cleared = await client.patch(f"{KEYS}/{key['id']}", json={"rate_limit": None, "limits": None}, headers=owner)
    assert cleared.json()["rate_limit"] is None and cleared.json()["limits"] == []

    updates = await entries(client, owner, 2, action="api_key.updated")
    assert {tuple(sorted(e["details"])) for e in updates} == {
        ("allowed_models", "allowed_routes", "name"),
        ("limits", "rate_limit"),
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"limits": [{"resource": "gold", "amount": 1, "period": "month"}]}, "limits.0.resource"),
        ({"limits": [{"resource": "ai_tokens", "amount": 0, "period": "month"}]}, "limits.0.amount"),
        ({"limits": [{"resource": "ai_tokens", "amount": -5, "period": "day"}]}, "limits.0.amount"),
        (
            {
                "limits": [
                    {"resource": "ai_tokens", "amount": 1, "period": "day"},
                    {"resource": "ai_tokens", "amount": 2, "period": "day"},
                ]
            },
            "limits",
        ),
        ({"allowed_ips": ["10.0.0.300/8"]}, "allowed_ips.0"),
        ({"allowed_ips": ["not an address"]}, "allowed_ips.0"),
        ({"allowed_routes": ["GET /v1/*/chat"]}, "allowed_routes.0"),
        ({"allowed_routes": ["/v1/chat"]}, "allowed_routes.0"),
        ({"allowed_models": ["gpt-4o"]}, "allowed_models.0"),
        ({"rate_limit": {"per_second": 6, "burst": 20, "per_minute": 120}}, "rate_limit"),  # free: 5/s
        ({"rate_limit": {"per_second": 5, "burst": 21, "per_minute": 120}}, "rate_limit"),
        ({"rate_limit": {"per_second": 5, "burst": 20, "per_minute": 121}}, "rate_limit"),
    ],
)
async def test_bad_rules_are_the_contracts_422_at_creation_and_in_a_patch(client, body, field):
    _, owner = await signup(client)
    key = await new_key(client, owner)
    for response in (
        await client.post(KEYS, json={"name": "x", **body}, headers=owner),
        await client.patch(f"{KEYS}/{key['id']}", json=body, headers=owner),
    ):
        assert response.status_code == 422, response.text
        assert code(response) == "validation_error"
        fields = [d["field"] for d in response.json()["error"]["details"]]
        assert any(f == field or f.startswith(field + ".") or f.startswith(field) for f in fields), fields
    # the key is as it was
    [listed] = (await client.get(KEYS, headers=owner)).json()["items"]
    assert listed["rate_limit"] is None and listed["limits"] == [] and listed["allowed_ips"] == []


async def test_the_plans_own_rate_limit_is_allowed(client):
    _, owner = await signup(client)
    key = await new_key(client, owner, rate_limit={"per_second": 5, "burst": 20, "per_minute": 120})
    assert key["rate_limit"]["burst"] == 20


async def test_who_may_change_a_key(client):
    account, owner = await signup(client)
    owners_key = await new_key(client, owner)
    narrow = {"allowed_models": ["openai/gpt-4o-mini"]}

    # an API key may never change a key, not even itself
    by_key = await client.patch(f"{KEYS}/{owners_key['id']}", json=narrow, headers=bearer(owners_key["key"]))
    assert (by_key.status_code, code(by_key)) == (403, "console_session_required")

    # a developer changes its own keys, not another user's
    developer = await add(client, owner, "developer")
    dev = await login(client, developer["email"])
    devs_key = await new_key(client, dev)
    assert (await client.patch(f"{KEYS}/{devs_key['id']}", json=narrow, headers=dev)).status_code == 200
    others = await client.patch(f"{KEYS}/{owners_key['id']}", json=narrow, headers=dev)
    assert (others.status_code, code(others)) == (403, "permission_denied")
    viewer = await login(client, (await add(client, owner, "viewer"))["email"])
    assert (await client.patch(f"{KEYS}/{devs_key['id']}", json=narrow, headers=viewer)).status_code == 403

    # another account's key, and an unknown one, are 404: neither seen nor changed
    _, stranger = await signup(client)
    for key_id in (owners_key["id"], str(uuid.uuid4())):
        foreign = await client.patch(f"{KEYS}/{key_id}", json=narrow, headers=stranger)
        assert (foreign.status_code, code(foreign)) == (404, "not_found")
    assert all(k["id"] != owners_key["id"] for k in (await client.get(KEYS, headers=stranger)).json()["items"])
    [mine, _] = (await client.get(KEYS, headers=owner)).json()["items"]
    assert mine["id"] == owners_key["id"] and mine["allowed_models"] == []
    assert account["id"]


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [("POST", "/toggle", None), ("DELETE", "", None), ("POST", "/rotate", {"grace_seconds": 0})],
)
async def test_an_api_key_may_not_toggle_delete_or_rotate_a_key(client, method, suffix, body):
    """Only a console session changes keys: an API key (even the account owner's, even on itself)
    gets 403 `console_session_required`, and the key is left as it was."""
    _, owner = await signup(client)
    caller, target = await new_key(client, owner, name="caller"), await new_key(client, owner, name="target")
    for key_id in (target["id"], caller["id"]):
        refused = await client.request(method, f"{KEYS}/{key_id}{suffix}", json=body, headers=bearer(caller["key"]))
        assert (refused.status_code, code(refused)) == (403, "console_session_required"), refused.text
    listed = (await client.get(KEYS, headers=owner)).json()["items"]
    assert sorted((k["id"], k["status"]) for k in listed) == sorted((k["id"], "enabled") for k in (caller, target))
