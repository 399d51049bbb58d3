"""(v4) Rotating a key never refills its own limits, on the real stack: the key made by
`POST /api/api-keys/{id}/rotate` continues its predecessor's lineage (keys.v1 `lineage_id`), so
quota counts both in one counter and the edge judges both where the lineage stands. Before,
the new key started from 0: a spent `once` trial became a fresh one after every rotation, and
during the grace period the old and the new key each had a full allowance."""

import uuid
from datetime import UTC, datetime

import pytest

from tests.integration.quota_helpers import eventually
from tests.integration.test_edge_verify import VERIFY, service_token
from tests.integration.test_keys_api import new_key, signup

pytestmark = pytest.mark.integration

TRIAL = 100  # the key's one-time ai_tokens credits


async def test_a_rotated_key_carries_on_its_predecessors_spending(app_client, settings):
    app, client = app_client
    account, console = await signup(client)
    old = await new_key(client, console, limits=[{"resource": "ai_tokens", "amount": TRIAL, "period": "once"}])
    token = await service_token(client, settings, ["keys:verify", "usage:write"])
    service = {"Authorization": f"Bearer {token}"}

    def usage_of(items: list[dict], key_id: str) -> dict | None:
        usage = next((k["usage"] for k in items if k["id"] == key_id), [])
        return next((u for u in usage if (u["resource"], u["period"]) == ("ai_tokens", "once")), None)

    # the old key spends its whole trial
    spent = {
        "id": str(uuid.uuid4()), "time": datetime.now(UTC).isoformat(), "account_id": account["id"],
        "resource": "ai_tokens", "quantity": TRIAL, "provider": "openai", "model": "gpt-4o", "source": "gateway",
        "api_key_id": old["id"],
    }  # fmt: skip
    reported = await client.post("/api/usage/events", json={"events": [spent]}, headers=service)
    assert reported.status_code == 202, reported.text

    async def old_spent() -> bool:
        items = (await client.get("/api/api-keys", headers=console)).json()["items"]
        usage = usage_of(items, old["id"])
        return usage is not None and usage["used"] == TRIAL

    await eventually(old_spent)

    rotated = await client.post(f"/api/api-keys/{old['id']}/rotate", json={"grace_seconds": 600}, headers=console)
    assert rotated.status_code == 201, rotated.text
    new = rotated.json()
    assert new["id"] != old["id"]

    # Neither key may spend now: not the new one, not the old one in its grace period.
    ask = {"method": "POST", "path": "/v1/chat", "ip": "203.0.113.7", "resource": "ai_tokens", "cost": 1}
    for secret in (new["key"], old["key"]):
        verdict = (await client.post(VERIFY, json={**ask, "key": secret}, headers=service)).json()
        assert verdict["code"] == "insufficient_quota", verdict
        assert verdict["error"]["error"]["details"]["scope"] == "api_key"

    # The new key's object shows the lineage's spending, at once and in the list.
    answered = usage_of([new], new["id"])
    assert answered is not None and (answered["used"], answered["remaining"]) == (TRIAL, 0), answered
    listed = (await client.get("/api/api-keys", headers=console)).json()["items"]
    assert (usage_of(listed, new["id"]) or {}).get("used") == TRIAL

    # A reservation for the new key is refused by the key's limit: quota judges by the new key's
    # keys.v1 state (its process's edge's when its own consumer is behind) where the lineage stands.
    async def reservation_refused() -> dict | None:
        body = {"account_id": account["id"], "resource": "ai_tokens", "amount": 1, "ttl_seconds": 60, "api_key_id": new["id"]}
        held = await client.post("/api/quota/reservations", json=body, headers=service)
        if held.status_code == 201:
            released = await client.delete(f"/api/quota/reservations/{held.json()['id']}", headers=service)
            assert released.status_code == 204, released.text
            return None
        return held.json()  # type: ignore[no-any-return]

    refused = await eventually(reservation_refused)
    assert refused["error"]["code"] == "insufficient_quota", refused
    assert refused["error"]["details"]["scope"] == "api_key" and refused["error"]["details"]["used"] == TRIAL

    # The edge's copy of keys.v1 carries the lineage: the old key's id.
    edge = app.state.runtime.edge
    assert edge.key_lineage(uuid.UUID(new["id"])) == uuid.UUID(old["id"])
