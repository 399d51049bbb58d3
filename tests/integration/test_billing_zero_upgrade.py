"""An upgrade whose prorated price rounds to 0.00 (free -> professional in the last minutes of a
period), on real Kafka and Postgres: the switch answers 200 and leaves the record of a paid
upgrade: the order (0.00, paid, no provider charge), its invoice, and order.created + order.paid in
the audit log."""

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from contracts.period import bounds_of
from services.billing.payments import TestProvider
from services.billing.service import NO_CHARGE
from services.edge import Overrides
from tests.integration.quota_helpers import SettableClock, eventually
from tests.integration.test_keys_api import signup
from tests.support.apps import running_app

pytestmark = pytest.mark.integration


async def test_a_zero_priced_upgrade_by_switch_has_its_paid_order_invoice_and_audit_entries(settings):
    clock, provider = SettableClock(), TestProvider()
    _, _, end = bounds_of(datetime.now(UTC), settings.tz)
    clock.fixed = end - timedelta(minutes=4)  # 49.00 x 240 s / a month of seconds < 0.005
    async with running_app(settings, overrides=Overrides(clock=clock, payment_provider=provider)) as (_app, client):
        _account, owner = await signup(client)  # at the fixed time too: its session is valid then

        switched = await client.post("/api/billing/subscription/switch", json={"plan": "professional"}, headers=owner)
        assert switched.status_code == 200, switched.text
        assert switched.json()["plan"] == "professional"
        assert (await client.get("/api/billing/subscription", headers=owner)).json()["plan"] == "professional"

        [order] = (await client.get("/api/billing/orders", headers=owner)).json()["items"]
        assert (order["kind"], order["status"], order["amount"], order["plan"], order["previous_plan"]) == (
            "plan_upgrade",
            "paid",
            "0.00",
            "professional",
            "free",
        )
        invoice = await client.get(f"/api/billing/orders/{order['id']}/invoice", headers=owner)
        assert invoice.status_code == 200 and invoice.json()["total"] == "0.00", invoice.text
        assert provider.attempts == 0  # nothing charged

        async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
            found = await conn.execute("SELECT payment_reference FROM billing.orders WHERE id = %s", (order["id"],))
            row = await found.fetchone()
        assert row == (NO_CHARGE,)

        async def audited() -> list[str] | None:
            response = await client.get("/api/audit-log", params={"limit": 50}, headers=owner)
            assert response.status_code == 200, response.text
            actions = sorted(i["action"] for i in response.json()["items"] if i["target"]["type"] == "order")
            return actions if len(actions) >= 2 else None

        assert await eventually(audited) == ["order.created", "order.paid"]
