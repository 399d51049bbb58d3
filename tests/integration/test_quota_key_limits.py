"""(v4) Limits per key on real Kafka and Postgres: quota learns a key's limits from keys.v1,
counts usage.v1 events that carry the key against them and the account at once, and refuses a
reservation over the key's limit with `details.scope: "api_key"` (HTTP, through the service
token), frees the key's part on settle."""

import asyncio
import uuid
from datetime import UTC, datetime

import pytest

from contracts.common import KeyStatus, Resource, Role
from contracts.events import KeyState, UsageEvent
from contracts.key_limits import KeyLimit, LimitPeriod
from contracts.topics import KEYS, USAGE
from services.quota.app import quota_service
from services.quota.domain import KeyLimitExhausted
from tests.integration.quota_helpers import eventually, publish
from tests.integration.test_keys_api import new_key, signup
from tests.support.service_tokens import service_headers

pytestmark = pytest.mark.integration


def key_with_limits(account: uuid.UUID, limits: list[KeyLimit], key: uuid.UUID | None = None, version: int = 1) -> KeyState:
    return KeyState(
        time=datetime.now(UTC),
        account_id=account,
        key_id=key or uuid.uuid4(),
        hash=uuid.uuid4().hex * 2,
        status=KeyStatus.ENABLED,
        roles=[Role.OWNER],
        limits=limits,
        version=version,
    )


async def test_a_keys_limit_counts_its_usage_and_refuses_a_reservation_past_it(app_client, settings):
    app, client = app_client
    quota = quota_service(app.state.runtime)
    account = uuid.uuid4()
    state = key_with_limits(account, [KeyLimit(resource=Resource.AI_TOKENS, amount=1_000, period=LimitPeriod.MONTH)])
    key = state.key_id
    await publish(settings, KEYS.name, [state], key=lambda e: str(e.key_id))

    async def limited() -> bool:  # quota has learnt the limit from keys.v1
        try:
            await quota.release(await _reserve(quota, account, key, 1_001))  # type: ignore[arg-type]
        except KeyLimitExhausted:
            return True
        return False

    await eventually(limited)
    used = UsageEvent(
        time=datetime.now(UTC), account_id=account, resource=Resource.AI_TOKENS, quantity=600, source="t", api_key_id=key
    )
    await publish(settings, USAGE.name, [used, used], key=lambda e: str(e.account_id))  # one event, delivered twice

    headers = await service_headers(client, settings)
    body = {"account_id": str(account), "resource": "ai_tokens", "amount": 401, "ttl_seconds": 60, "api_key_id": str(key)}

    async def refused_by_the_key():
        answer = await client.post("/api/quota/reservations", json=body, headers=headers)
        if answer.status_code == 201:  # quota has not counted the 600 yet: give the hold back, or it would stand in the way below
            await client.delete(f"/api/quota/reservations/{answer.json()['id']}", headers=headers)
        return answer if answer.status_code == 403 else None

    answer = await eventually(refused_by_the_key)
    details = answer.json()["error"]["details"]
    assert answer.json()["error"]["code"] == "insufficient_quota"
    assert (details["scope"], details["used"], details["total"], details["limit_period"]) == ("api_key", 600, 1_000, "month")
    fits = await client.post("/api/quota/reservations", json={**body, "amount": 400}, headers=headers)
    assert fits.status_code == 201, fits.text
    # the account alone (no key): the free tier's 100,000, minus the key's 600 and its 400 held
    account_only = {k: v for k, v in body.items() if k != "api_key_id"} | {"amount": 99_001}
    over = await client.post("/api/quota/reservations", json=account_only, headers=headers)
    assert over.status_code == 403 and over.json()["error"]["details"]["scope"] == "account"
    # releasing frees the key's part
    released = await client.delete(f"/api/quota/reservations/{fits.json()['id']}", headers=headers)
    assert released.status_code == 204
    again = await client.post("/api/quota/reservations", json={**body, "amount": 400}, headers=headers)
    assert again.status_code == 201


async def _reserve(quota, account: uuid.UUID, key: uuid.UUID, amount: int) -> uuid.UUID:
    return (await quota.reserve(account, Resource.AI_TOKENS, amount, 60, api_key_id=key)).id


async def test_narrowing_a_keys_limit_fires_its_key_rules_it_crosses_once(app_client, settings):
    """Over HTTP, as a customer does it: a key with 1,000 ai_tokens a month has spent 450 (45%)
    and an 80% rule watches it. PATCHing the limit to 500 puts it at 90%: the rule fires, as an
    account's downgrade fires the account's rules (before, the key's mark moved there silently and
    the rule never fired). Narrowing again to 460 (97%) fires nothing more: once per threshold."""
    client = app_client[1]
    _, console = await signup(client)
    key = await new_key(client, console, limits=[{"resource": "ai_tokens", "amount": 1_000, "period": "month"}])
    rule_body = {
        "metric": "total_tokens",
        "threshold_pct": 80,
        "channels": ["in_site"],
        "recipients": [],
        "scope": {"api_key_id": key["id"]},
    }

    async def rule_made() -> bool:  # alerts has the key from keys.v1
        return (await client.post("/api/ai/usage/alert", json=rule_body, headers=console)).status_code == 201

    await eventually(rule_made)
    service = await service_headers(client, settings)
    account_id = (await client.get("/api/account", headers=console)).json()["id"]
    event = {
        "id": str(uuid.uuid4()),
        "time": datetime.now(UTC).isoformat(),
        "account_id": account_id,
        "resource": "ai_tokens",
        "quantity": 450,
        "source": "test",
        "api_key_id": key["id"],
    }
    sent = await client.post("/api/usage/events", json={"events": [event]}, headers=service)
    assert sent.status_code == 202, sent.text

    async def used(amount: int) -> bool:
        items = (await client.get("/api/api-keys", headers=console)).json()["items"]
        usage = next(i for i in items if i["id"] == key["id"])["usage"]
        return [(u["used"], u["amount"]) for u in usage] == [(450, amount)]

    async def notified() -> list[dict] | None:
        items = (await client.get("/api/notifications", headers=console)).json()["items"]
        return [i for i in items if i.get("threshold_pct") == 80] or None

    await eventually(lambda: used(1_000))
    for amount in (500, 460):
        patched = await client.patch(
            f"/api/api-keys/{key['id']}",
            json={"limits": [{"resource": "ai_tokens", "amount": amount, "period": "month"}]},
            headers=console,
        )
        assert patched.status_code == 200, patched.text
        await eventually(lambda amount=amount: used(amount))
        assert len(await eventually(notified, within=10.0)) == 1
    await asyncio.sleep(1.0)  # a second firing would have arrived by now
    assert len(await notified() or []) == 1
