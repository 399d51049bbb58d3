"""(v4) Limits per key on real Kafka and Postgres: quota learns a key's limits from keys.v1,
counts usage.v1 events that carry the key against them and the account at once, and refuses a
reservation over the key's limit with `details.scope: "api_key"` (HTTP, through the service
token), frees the key's part on settle."""

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
