"""Money is a console operation and a retry never charges twice (issue 15, item 3), on real
Kafka and Postgres: API keys are refused on every money and plan route, `Idempotency-Key`
replays the first answer, and doubled or concurrent payments reach the provider once."""

import asyncio
import uuid

import pytest

from services.billing.payments import TestProvider
from services.edge import Overrides
from tests.integration.quota_helpers import bearer, new_account, new_api_key
from tests.support.apps import running_app

pytestmark = pytest.mark.integration

PACKAGE = {"kind": "quota_package", "package": {"resource": "ai_tokens", "amount": 200_000}}


@pytest.fixture(scope="module")
def module_provider() -> TestProvider:
    return TestProvider()


@pytest.fixture(scope="module")
async def module_app_client(module_settings, module_provider):
    """The whole platform with a payment provider the module holds (it counts the charges), shared
    by the module's tests: each makes accounts and orders of its own."""
    async with running_app(module_settings, overrides=Overrides(payment_provider=module_provider)) as pair:
        yield pair


@pytest.fixture
def provider(module_provider: TestProvider) -> TestProvider:
    """The module's provider with its counts from zero for this test (the tests run one after the
    other, and none pays an order of another)."""
    module_provider.attempts = 0
    module_provider.charges.clear()
    return module_provider


@pytest.fixture
def settings(module_settings):
    return module_settings


@pytest.fixture
def app_client(module_app_client):
    return module_app_client


def code(response) -> str:
    return response.json()["error"]["code"]


async def count_orders(pool, account_id) -> int:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM billing.orders WHERE account_id = %s", (account_id,))
        row = await cur.fetchone()
    return int(row["n"])


async def purchases_of(pool, order_id: str) -> int:
    """package_purchased events queued for billing.v1 that name this order."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM billing.outbox WHERE convert_from(value, 'UTF8')::jsonb ->> 'order_id' = %s",
            (order_id,),
        )
        row = await cur.fetchone()
    return int(row["n"])


async def test_an_api_key_is_refused_on_every_money_and_plan_route(app_client, settings, pool, provider):
    app, client = app_client
    account_id, session = await new_account(app, settings)
    key = bearer(await new_api_key(app, settings, account_id))
    order = await client.post("/api/billing/orders", json=PACKAGE, headers=bearer(session))
    assert order.status_code == 201

    refused = [
        await client.post("/api/billing/orders", json=PACKAGE, headers=key),
        await client.post("/api/billing/orders", json=PACKAGE, headers={**key, "Idempotency-Key": "k1"}),
        await client.post(f"/api/billing/orders/{order.json()['id']}/pay", headers=key),
        await client.post("/api/billing/subscription/switch", json={"plan": "basic"}, headers=key),
        await client.post("/api/billing/subscription/switch", json={"plan": "free"}, headers=key),
        await client.put("/api/account/user-type", json={"user_type": "enterprise"}, headers=key),
    ]
    assert [(r.status_code, code(r)) for r in refused] == [(403, "console_session_required")] * len(refused)
    assert all(r.json()["error"]["request_id"] for r in refused)
    # Nothing happened: one order (the session's), still pending, nothing charged, still free.
    assert await count_orders(pool, account_id) == 1
    assert provider.attempts == 0
    assert (await client.get("/api/billing/subscription", headers=key)).json()["plan"] == "free"  # reads stay open
    paid = await client.post(f"/api/billing/orders/{order.json()['id']}/pay", headers=bearer(session))
    assert paid.status_code == 200 and paid.json()["status"] == "paid"


async def test_a_retried_order_returns_the_first_answer_and_another_body_is_409(app_client, settings, pool):
    app, client = app_client
    account_id, session = await new_account(app, settings)
    other_id, other_session = await new_account(app, settings)
    first = await client.post("/api/billing/orders", json=PACKAGE, headers={**bearer(session), "Idempotency-Key": "order-1"})
    assert first.status_code == 201, first.text
    # The same body, written differently (key order, spacing), is the same request.
    same = '{"package": {"amount": 200000, "resource": "ai_tokens"},  "kind": "quota_package"}'
    retry = await client.post(
        "/api/billing/orders",
        content=same,
        headers={**bearer(session), "Idempotency-Key": "order-1", "Content-Type": "application/json"},
    )
    assert (retry.status_code, retry.json()) == (201, first.json())

    # Concurrent retries: every one answers the first order; no second order is made.
    retries = await asyncio.gather(
        *[
            client.post("/api/billing/orders", json=PACKAGE, headers={**bearer(session), "Idempotency-Key": "order-2"})
            for _ in range(12)
        ]
    )
    assert {r.status_code for r in retries} == {201}
    assert len({r.json()["id"] for r in retries}) == 1 and retries[0].json()["id"] != first.json()["id"]
    assert await count_orders(pool, account_id) == 2

    reused = await client.post(
        "/api/billing/orders",
        json={"kind": "plan_upgrade", "plan": "basic"},
        headers={**bearer(session), "Idempotency-Key": "order-1"},
    )
    assert (reused.status_code, code(reused)) == (409, "idempotency_key_reused")
    assert reused.json()["error"]["request_id"]
    assert await count_orders(pool, account_id) == 2
    # Keys are per account: another account's "order-1" is its own request.
    theirs = await client.post(
        "/api/billing/orders", json=PACKAGE, headers={**bearer(other_session), "Idempotency-Key": "order-1"}
    )
    assert theirs.status_code == 201 and theirs.json()["id"] != first.json()["id"]
    assert await count_orders(pool, other_id) == 1
    # A refused request is not remembered: the key stays free for a corrected retry.
    bad = await client.post(
        "/api/billing/orders",
        json={"kind": "quota_package", "package": {"resource": "ai_tokens", "amount": 15}},
        headers={**bearer(session), "Idempotency-Key": "order-3"},
    )
    assert (bad.status_code, code(bad)) == (422, "validation_error")
    fixed = await client.post("/api/billing/orders", json=PACKAGE, headers={**bearer(session), "Idempotency-Key": "order-3"})
    assert fixed.status_code == 201
    assert await count_orders(pool, account_id) == 3


async def test_doubled_and_concurrent_payments_charge_once(app_client, settings, pool, provider):
    app, client = app_client
    _, session = await new_account(app, settings)
    auth = bearer(session)

    # A doubled payment (the network lost the first answer): same key, the first answer, one charge.
    order = (await client.post("/api/billing/orders", json=PACKAGE, headers=auth)).json()
    pay = f"/api/billing/orders/{order['id']}/pay"
    first = await client.post(pay, headers={**auth, "Idempotency-Key": "pay-1"})
    again = await client.post(pay, headers={**auth, "Idempotency-Key": "pay-1"})
    assert first.status_code == again.status_code == 200 and first.json()["status"] == "paid"
    assert again.json() == first.json()
    # Without a key, or with a fresh one: the paid order unchanged, nothing charged.
    for headers in (auth, {**auth, "Idempotency-Key": "pay-2"}):
        repeat = await client.post(pay, headers=headers)
        assert (repeat.status_code, repeat.json()) == (200, first.json())
    assert provider.attempts == 1 and list(provider.charges) == [uuid.UUID(order["id"])]
    assert await purchases_of(pool, order["id"]) == 1

    # Concurrent payments of one order, with and without keys: one charge, one purchase event.
    second = (await client.post("/api/billing/orders", json=PACKAGE, headers=auth)).json()
    pay2 = f"/api/billing/orders/{second['id']}/pay"
    answers = await asyncio.gather(
        *[client.post(pay2, headers={**auth, "Idempotency-Key": "pay-3"}) for _ in range(8)],
        *[client.post(pay2, headers=auth) for _ in range(8)],
    )
    assert {r.status_code for r in answers} == {200}
    assert len({r.text for r in answers}) == 1 and answers[0].json()["status"] == "paid"
    assert provider.attempts == 2 and len(provider.charges) == 2
    assert await purchases_of(pool, second["id"]) == 1

    # The key of one payment cannot pay another order: 409, and that order stays pending.
    third = (await client.post("/api/billing/orders", json=PACKAGE, headers=auth)).json()
    reused = await client.post(f"/api/billing/orders/{third['id']}/pay", headers={**auth, "Idempotency-Key": "pay-1"})
    assert (reused.status_code, code(reused)) == (409, "idempotency_key_reused")
    assert provider.attempts == 2 and await purchases_of(pool, third["id"]) == 0


async def test_an_empty_or_too_long_key_is_422(app_client, settings, provider):
    app, client = app_client
    _, session = await new_account(app, settings)
    auth = bearer(session)
    order = (await client.post("/api/billing/orders", json=PACKAGE, headers=auth)).json()
    for key in ("", "k" * 256):
        for response in (
            await client.post("/api/billing/orders", json=PACKAGE, headers={**auth, "Idempotency-Key": key}),
            await client.post(f"/api/billing/orders/{order['id']}/pay", headers={**auth, "Idempotency-Key": key}),
        ):
            assert (response.status_code, code(response)) == (422, "validation_error"), response.text
            assert any("idempotency-key" in d["field"].lower() for d in response.json()["error"]["details"])
    longest = await client.post("/api/billing/orders", json=PACKAGE, headers={**auth, "Idempotency-Key": "k" * 255})
    assert longest.status_code == 201
    assert provider.attempts == 0
