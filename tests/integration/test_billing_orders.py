"""Money users can check (issue #19 item 3) on real Kafka and Postgres: the package catalogue, the
order history, one order, its invoice (JSON and printable HTML) with gapless numbers per seller,
and the refusals: another account's order 404, an API key 403, an unpaid order's invoice 409."""

import asyncio
import re
import uuid

import pytest

from services.billing.domain import seller
from services.billing.store import BillingTx
from tests.conftest import opened_pool
from tests.integration.quota_helpers import bearer, new_account, new_api_key
from tests.support.apps import running_app

pytestmark = pytest.mark.integration

PACKAGE = {"kind": "quota_package", "package": {"resource": "ai_tokens", "amount": 200_000}}


@pytest.fixture
def settings(module_settings):
    return module_settings


@pytest.fixture
def app_client(module_app_client):
    """Each test makes accounts of its own: one platform for the module (conftest.module_app_client)."""
    return module_app_client


def code(response) -> str:
    return response.json()["error"]["code"]


async def test_the_package_catalogue_is_public(client):
    response = await client.get("/api/billing/packages")
    assert response.status_code == 200
    body = response.json()
    assert body["currency"] == "USD"
    items = {i["resource"]: i for i in body["items"]}
    assert items["ai_tokens"] == {"resource": "ai_tokens", "unit": 100000, "unit_price": "1.00"}
    assert items["geo_projects"]["unit_price"] == "0.50" and len(items) == 6


async def test_order_history_one_order_and_the_invoice(app_client, settings):
    app, client = app_client
    account_id, session = await new_account(app, settings)
    _, other_session = await new_account(app, settings)
    auth = bearer(session)
    made = [(await client.post("/api/billing/orders", json=PACKAGE, headers=auth)).json() for _ in range(5)]
    upgrade = await client.post("/api/billing/orders", json={"kind": "plan_upgrade", "plan": "basic"}, headers=auth)
    made.append(upgrade.json())
    theirs = (await client.post("/api/billing/orders", json=PACKAGE, headers=bearer(other_session))).json()

    # Newest first, by keyset pages; another account's order is never listed.
    seen, cursor = [], None
    while True:
        page = await client.get(
            "/api/billing/orders", params={"limit": 4, **({"cursor": cursor} if cursor else {})}, headers=auth
        )
        assert page.status_code == 200, page.text
        seen += page.json()["items"]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert [o["id"] for o in seen] == [o["id"] for o in reversed(made)]
    assert seen[0] == made[-1]
    bad = await client.get("/api/billing/orders", params={"cursor": "nonsense"}, headers=auth)
    assert (bad.status_code, code(bad)) == (422, "validation_error")
    assert (await client.get("/api/billing/orders", params={"limit": 0}, headers=auth)).status_code == 422

    one = await client.get(f"/api/billing/orders/{made[0]['id']}", headers=auth)
    assert (one.status_code, one.json()) == (200, made[0])
    for path in (f"/api/billing/orders/{theirs['id']}", f"/api/billing/orders/{uuid.uuid4()}"):
        missing = await client.get(path, headers=auth)
        assert (missing.status_code, code(missing)) == (404, "not_found")

    # The invoice: 409 while pending, then the paid order's, in JSON and as a printable page.
    invoice_path = f"/api/billing/orders/{made[0]['id']}/invoice"
    pending = await client.get(invoice_path, headers=auth)
    assert (pending.status_code, code(pending)) == (409, "conflict") and pending.json()["error"]["request_id"]
    paid = await client.post(f"/api/billing/orders/{made[0]['id']}/pay", headers=auth)
    assert paid.status_code == 200
    invoice = await client.get(invoice_path, headers=auth)
    assert invoice.status_code == 200, invoice.text
    body = invoice.json()
    assert re.fullmatch(r"TG-\d{6}", body["number"]) and body["order_id"] == made[0]["id"]
    assert body["issued_at"] == paid.json()["paid_at"] and body["total"] == "2.00" and body["currency"] == "USD"
    assert body["lines"] == [
        {"description": body["lines"][0]["description"], "quantity": 2, "unit_price": "1.00", "amount": "2.00"}
    ]
    assert body["seller"]["name"] == seller().name and body["buyer"]["account_id"] == str(account_id)
    page = await client.get(invoice_path, headers={**auth, "Accept": "text/html"})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert body["number"] in page.text and "2.00 USD" in page.text and seller().name in page.text
    assert (await client.get(invoice_path, headers={**auth, "Accept": "application/json"})).json() == body

    # Another account cannot see it (404, like a missing one), in either form.
    for headers in (bearer(other_session), {**bearer(other_session), "Accept": "text/html"}):
        hidden = await client.get(invoice_path, headers=headers)
        assert (hidden.status_code, code(hidden)) == (404, "not_found")


async def test_an_api_key_and_no_credentials_are_refused_on_the_console_routes(app_client, settings):
    app, client = app_client
    account_id, session = await new_account(app, settings)
    key = bearer(await new_api_key(app, settings, account_id))
    order = (await client.post("/api/billing/orders", json=PACKAGE, headers=bearer(session))).json()
    await client.post(f"/api/billing/orders/{order['id']}/pay", headers=bearer(session))
    paths = ["/api/billing/orders", f"/api/billing/orders/{order['id']}", f"/api/billing/orders/{order['id']}/invoice"]
    for path in paths:
        refused = await client.get(path, headers=key)
        assert (refused.status_code, code(refused)) == (403, "console_session_required"), path
        assert (await client.get(path)).status_code == 401
        assert (await client.get(path, headers=bearer(session))).status_code == 200


async def test_concurrent_payments_number_invoices_one_to_n_without_gap_or_duplicate(fresh_settings):
    """Numbers count from 1 on a database of the test's own: a platform of its own, not the module's
    (whose other tests pay orders too)."""
    settings = fresh_settings
    async with running_app(settings) as (app, client), opened_pool(settings.database_url) as pool:
        sessions = [(await new_account(app, settings))[1] for _ in range(4)]
        orders = [
            (s, (await client.post("/api/billing/orders", json=PACKAGE, headers=bearer(s))).json()["id"])
            for s in sessions
            for _ in range(5)
        ]

        async def rolled_back_number() -> None:
            """A payment that took a number and then failed: its transaction takes the number back."""
            with pytest.raises(RuntimeError):
                async with pool.connection() as conn, conn.transaction():
                    await BillingTx(conn).take_invoice_number(seller().id)
                    await asyncio.sleep(0.05)
                    raise RuntimeError("the payment failed after its number was taken")

        answers = await asyncio.gather(
            *[client.post(f"/api/billing/orders/{o}/pay", headers=bearer(s)) for s, o in orders],
            *[client.post(f"/api/billing/orders/{o}/pay", headers=bearer(s)) for s, o in orders[:6]],  # doubled
            *[rolled_back_number() for _ in range(4)],
        )
        assert {a.status_code for a in answers if a is not None} == {200}
        numbers = []
        for s, o in orders:
            invoice = await client.get(f"/api/billing/orders/{o}/invoice", headers=bearer(s))
            numbers.append(int(invoice.json()["number"].removeprefix("TG-")))
        assert sorted(numbers) == list(range(1, len(orders) + 1))
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT last_number FROM billing.invoice_counters WHERE seller = %s", (seller().id,))
            assert (await cur.fetchone())["last_number"] == len(orders)
