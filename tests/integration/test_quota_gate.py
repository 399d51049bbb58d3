"""Quota end to end on real Kafka and Postgres: exhaustion, upgrade, package, new period."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from contracts.common import Resource
from contracts.events import UsageEvent
from contracts.topics import USAGE
from services.edge import Overrides
from tests.integration.quota_helpers import SettableClock, bearer, eventually, new_account, new_api_key, publish
from tests.support.apps import running_app

pytestmark = pytest.mark.integration


@pytest.fixture
def clock() -> SettableClock:
    return SettableClock()


@pytest.fixture
async def app_client(settings, clock):
    async with running_app(settings, overrides=Overrides(clock=clock)) as pair:
        yield pair


def usage(account_id, resource: Resource, quantity: int, when: datetime | None = None) -> UsageEvent:
    return UsageEvent(time=when or datetime.now(UTC), account_id=account_id, resource=resource, quantity=quantity, source="test")


def item(report: dict, resource: Resource) -> dict:
    return next(i for i in report["items"] if i["resource"] == resource.value)


async def test_exhausted_quota_blocks_and_a_paid_upgrade_unblocks_at_once(app_client, settings, clock):
    app, client = app_client
    account_id, session = await new_account(app, settings)
    key = await new_api_key(app, settings, account_id)
    assert (await client.get("/api/billing/check-quota", headers=bearer(key))).status_code == 200

    # Use up the free tier's api_calls (1000) through usage.v1.
    await publish(settings, USAGE.name, [usage(account_id, Resource.API_CALLS, 1000)], key=lambda e: str(e.account_id))

    async def blocked():  # (v2) any route but the two quota reads, which stay open
        response = await client.get("/api/geo/projects", headers=bearer(key))
        return response if response.status_code == 403 else None

    denied = await blocked_response(blocked)
    assert denied.json()["error"]["code"] == "insufficient_quota"
    report = (await client.get("/api/ai/usage/quota", headers=bearer(session))).json()
    calls = item(report, Resource.API_CALLS)
    assert calls["status"] == "exhausted" and calls["band"] == "red" and calls["remaining"] == 0

    # Upgrade to basic, paid, at a fixed "now": the amount is prorated over the rest of the month.
    now = datetime.now(UTC).replace(day=11, hour=0, minute=0, second=0, microsecond=0)
    clock.fixed = now
    order = await client.post("/api/billing/orders", json={"kind": "plan_upgrade", "plan": "basic"}, headers=bearer(session))
    assert order.status_code == 201, order.text
    start = now.replace(day=1)
    end = (start + timedelta(days=32)).replace(day=1)
    expected = (Decimal("9.90") * Decimal((end - now).days) / Decimal((end - start).days)).quantize(Decimal("0.01"))
    assert order.json()["amount"] == str(expected) and order.json()["status"] == "pending"
    paid = await client.post(f"/api/billing/orders/{order.json()['id']}/pay", headers=bearer(session))
    assert paid.status_code == 200 and paid.json()["status"] == "paid"
    clock.fixed = None

    async def allowed():
        response = await client.get("/api/geo/projects", headers=bearer(key))
        return response if response.status_code == 200 else None

    await eventually(allowed)

    async def upgraded():
        report = (await client.get("/api/billing/check-quota", headers=bearer(key))).json()
        return report if item(report, Resource.API_CALLS)["total"] == 50000 else None

    assert item(await eventually(upgraded), Resource.API_CALLS)["total"] == 50000
    subscription = (await client.get("/api/billing/subscription", headers=bearer(session))).json()
    assert subscription["plan"] == "basic" and subscription["user_type"] == "individual"


async def blocked_response(probe):
    return await eventually(probe)


async def test_package_adds_to_this_period_and_a_new_period_resets_flows_but_keeps_stocks(settings):
    clock = SettableClock()
    async with running_app(settings, overrides=Overrides(clock=clock)) as (app, client):
        await _package_then_next_period(app, client, settings, clock)


async def _package_then_next_period(app, client, settings, clock: SettableClock):
    account_id, session = await new_account(app, settings)
    events = [usage(account_id, Resource.AI_TOKENS, 100_000), usage(account_id, Resource.GEO_PROJECTS, 2)]
    await publish(settings, USAGE.name, events, key=lambda e: str(e.account_id))

    async def report_when(check):
        async def probe():
            body = (await client.get("/api/billing/check-quota", headers=bearer(session))).json()
            return body if check(body) else None

        return await eventually(probe)

    await report_when(lambda r: item(r, Resource.AI_TOKENS)["status"] == "exhausted")

    order = await client.post(
        "/api/billing/orders",
        json={"kind": "quota_package", "package": {"resource": "ai_tokens", "amount": 200_000}},
        headers=bearer(session),
    )
    assert order.status_code == 201 and order.json()["amount"] == "2.00"
    assert (await client.post(f"/api/billing/orders/{order.json()['id']}/pay", headers=bearer(session))).status_code == 200
    report = await report_when(lambda r: item(r, Resource.AI_TOKENS)["total"] == 300_000)
    tokens = item(report, Resource.AI_TOKENS)
    assert tokens["used"] == 100_000 and tokens["status"] == "available" and tokens["usage_rate"] == 33.33

    # Next month (the clock of the app's bootstrap): flows are full again, the package lapsed, stocks stay.
    next_month = (datetime.now(UTC).replace(day=1) + timedelta(days=32)).replace(day=1, hour=0, minute=0, second=0)
    clock.fixed = next_month
    report = (await client.get("/api/billing/check-quota", headers=bearer(session))).json()
    assert report["period"]["start"].startswith(next_month.strftime("%Y-%m-01T00:00:00"))
    assert item(report, Resource.AI_TOKENS) == {
        "resource": "ai_tokens",
        "total": 100_000,
        "used": 0,
        "remaining": 100_000,
        "usage_rate": 0.0,
        "status": "available",
        "band": "green",
    }
    assert item(report, Resource.GEO_PROJECTS)["used"] == 2
