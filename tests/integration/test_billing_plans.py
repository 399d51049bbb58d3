"""Billing on real Kafka and Postgres: the version-12 rule, switches, the outbox to billing.v1."""

import asyncio
import json
from datetime import UTC, datetime

import pytest
from aiokafka import AIOKafkaConsumer

from contracts.common import UserType
from contracts.events import UserTypeChanged
from contracts.topics import BILLING
from tests.integration.quota_helpers import bearer, eventually, new_account, publish

pytestmark = pytest.mark.integration


@pytest.fixture
def settings(module_settings):
    return module_settings


@pytest.fixture
def app_client(module_app_client):
    """Each test makes accounts of its own: one platform for the module (conftest.module_app_client)."""
    return module_app_client


async def test_plans_are_public_and_priced_from_the_catalogue(client):
    body = (await client.get("/api/billing/plans")).json()
    assert [p["tier"] for p in body["items"]] == ["free", "basic", "professional", "enterprise"]
    basic = body["items"][1]
    assert basic["monthly_price"] == "9.90" and basic["currency"] == "USD" and basic["quotas"]["api_calls"] == 50000


async def test_individual_cannot_order_or_switch_to_enterprise_until_the_user_type_changes(app_client, settings):
    app, client = app_client
    account_id, session = await new_account(app, settings, UserType.INDIVIDUAL)
    auth = bearer(session)
    # Concurrent attempts: none gets through.
    attempts = await asyncio.gather(
        *[
            client.post("/api/billing/orders", json={"kind": "plan_upgrade", "plan": "enterprise"}, headers=auth)
            for _ in range(5)
        ],
        *[client.post("/api/billing/subscription/switch", json={"plan": "enterprise"}, headers=auth) for _ in range(5)],
    )
    assert {r.status_code for r in attempts} == {409}
    assert {r.json()["error"]["code"] for r in attempts} == {"user_type_plan_mismatch"}
    assert "user type" in attempts[0].json()["error"]["message"]

    # keys publishes user_type_changed on billing.v1; billing follows it.
    changed = UserTypeChanged(time=datetime.now(UTC), account_id=account_id, user_type=UserType.ENTERPRISE)
    await publish(settings, BILLING.name, [changed], key=lambda e: str(e.account_id))

    async def order_accepted():
        r = await client.post("/api/billing/orders", json={"kind": "plan_upgrade", "plan": "enterprise"}, headers=auth)
        return r if r.status_code == 201 else None

    order = (await eventually(order_accepted)).json()
    assert order["plan"] == "enterprise" and order["previous_plan"] == "free" and order["status"] == "pending"

    switched = await client.post("/api/billing/subscription/switch", json={"plan": "enterprise"}, headers=auth)
    assert switched.status_code == 402
    error = switched.json()["error"]
    assert error["code"] == "payment_required" and error["details"]["order"]["plan"] == "enterprise"
    paid = await client.post(f"/api/billing/orders/{error['details']['order']['id']}/pay", headers=auth)
    assert paid.status_code == 200 and paid.json()["status"] == "paid"

    # Downgrade: no charge, 200 at once; and the plan changes reach billing.v1 through the outbox.
    down = await client.post("/api/billing/subscription/switch", json={"plan": "basic"}, headers=auth)
    assert down.status_code == 200 and down.json()["plan"] == "basic" and down.json()["user_type"] == "enterprise"
    consumer = AIOKafkaConsumer(
        settings.topic(BILLING.name), bootstrap_servers=settings.kafka_bootstrap_servers, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        seen: list[dict] = []

        async def both_changes():
            for records in (await consumer.getmany(timeout_ms=200)).values():
                seen.extend(json.loads(r.value) for r in records)
            mine = [e for e in seen if e["account_id"] == str(account_id)]  # billing.v1 is the module's
            plans = [(e["previous_plan"], e["plan"]) for e in mine if e["type"] == "plan_changed"]
            return plans if len(plans) >= 2 else None

        assert await eventually(both_changes) == [("free", "enterprise"), ("enterprise", "basic")]
    finally:
        await consumer.stop()

    # A stale order (made before the downgrade) cannot be paid any more.
    stale = await client.post(f"/api/billing/orders/{order['id']}/pay", headers=auth)
    assert stale.status_code == 409


async def test_orders_of_another_account_are_not_found_and_bad_packages_are_422(app_client, settings):
    app, client = app_client
    _, mine = await new_account(app, settings)
    _, theirs = await new_account(app, settings)
    order = await client.post(
        "/api/billing/orders",
        json={"kind": "quota_package", "package": {"resource": "api_calls", "amount": 20000}},
        headers=bearer(theirs),
    )
    assert order.status_code == 201 and order.json()["amount"] == "4.00"
    assert (await client.post(f"/api/billing/orders/{order.json()['id']}/pay", headers=bearer(mine))).status_code == 404
    odd = await client.post(
        "/api/billing/orders",
        json={"kind": "quota_package", "package": {"resource": "api_calls", "amount": 15}},
        headers=bearer(mine),
    )
    assert odd.status_code == 422 and odd.json()["error"]["code"] == "validation_error"
    assert (await client.get("/api/billing/subscription")).status_code == 401
