"""(v4) The edge's gate on a key's own limits, on the real stack (Redis admissions, keys.v1 and
quota.v1): a key's api_calls limit through a protected route and through verify, refused with
`details.scope: "api_key"` once spent, never past it; verify's `key_limits`; a cost over the key's
ai_tokens limit refused by the key, one over the account's by the account."""

import hashlib
import secrets
import uuid
from datetime import UTC, datetime

import pytest

from contracts.common import KeyStatus, Role
from contracts.events import KeyState
from contracts.key_limits import KeyLimit, LimitPeriod
from contracts.topics import KEYS
from tests.integration.quota_helpers import eventually, new_account, publish
from tests.integration.test_edge_verify import VERIFY, service_token
from tests.integration.test_keys_api import bearer

pytestmark = pytest.mark.integration


async def limited_key(app, settings, account_id: uuid.UUID, limits: list[KeyLimit]) -> tuple[str, uuid.UUID]:
    secret = "sk-" + secrets.token_urlsafe(40)
    state = KeyState(
        time=datetime.now(UTC),
        account_id=account_id,
        key_id=uuid.uuid4(),
        hash=hashlib.sha256(secret.encode()).hexdigest(),
        status=KeyStatus.ENABLED,
        roles=[Role.OWNER],
        limits=limits,
    )
    await publish(settings, KEYS.name, [state], key=lambda e: str(e.key_id))  # as the keys service will
    edge = app.state.runtime.edge

    async def known() -> bool:
        return edge.keys.get(state.hash) is not None

    await eventually(known)
    return secret, state.key_id


async def test_a_keys_limits_gate_routes_and_verify_with_their_scope(app_client, settings):
    app, client = app_client
    account, _session = await new_account(app, settings)
    calls = KeyLimit(resource="api_calls", amount=3, period=LimitPeriod.ONCE)
    tokens = KeyLimit(resource="ai_tokens", amount=500, period=LimitPeriod.MONTH)
    key, _key_id = await limited_key(app, settings, account, [calls, tokens])
    service = {"Authorization": f"Bearer {await service_token(client, settings, ['keys:verify'])}"}
    ask = {"key": key, "method": "POST", "path": "/v1/chat", "ip": "203.0.113.7"}

    first = (await client.post(VERIFY, json={**ask, "resource": "ai_tokens", "cost": 500}, headers=service)).json()
    assert first["valid"], first
    remaining = {(x["resource"], x["period"]): x["remaining"] for x in first["key_limits"]}
    # api_calls as quota last counted them: this very call is in Redis's admissions, not yet in a state
    assert remaining[("ai_tokens", "month")] == 500 and remaining[("api_calls", "once")] in (2, 3)
    over_key = (await client.post(VERIFY, json={**ask, "resource": "ai_tokens", "cost": 501}, headers=service)).json()
    assert over_key["code"] == "insufficient_quota" and over_key["error"]["error"]["details"]["scope"] == "api_key"
    assert over_key["error"]["error"]["details"]["total"] == 500
    routed = await client.get("/api/geo/projects", headers=bearer(key))  # the 2nd api_call
    assert routed.status_code == 200
    third = (await client.post(VERIFY, json=ask, headers=service)).json()
    assert third["valid"]
    refused = await client.get("/api/geo/projects", headers=bearer(key))
    assert refused.status_code == 403, refused.text
    details = refused.json()["error"]["details"]
    assert (details["scope"], details["resource"], details["total"], details["period_end"]) == ("api_key", "api_calls", 3, None)
    again = (await client.post(VERIFY, json=ask, headers=service)).json()
    assert again["code"] == "insufficient_quota" and again["error"]["error"]["details"]["scope"] == "api_key"

    # another key of the account without limits: the account's refusal carries scope account
    other, _ = await limited_key(app, settings, account, [])
    account_over = (
        await client.post(VERIFY, json={**ask, "key": other, "resource": "ai_tokens", "cost": 10**9}, headers=service)
    ).json()
    assert account_over["code"] == "insufficient_quota" and account_over["error"]["error"]["details"]["scope"] == "account"
    assert account_over["key_limits"] == []
