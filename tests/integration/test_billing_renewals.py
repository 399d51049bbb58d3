"""Renewals (docs/api.md, "Renewals") on real Postgres and Kafka: at a period's start the renewal
job makes one paid `plan_renewal` order of the full monthly price, with its invoice and its
`order.created`/`order.paid` audit entries, for an account on a paid plan and nothing for one on
free; two replicas running the job at the same instant make one order and one charge. A renewal
declined to the end of its grace puts the account on free, in force at the edge."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from uuid import UUID, uuid4

import pytest
from fastapi import FastAPI

from contracts.common import Tier, UserType
from contracts.period import bounds_of
from services.billing import domain
from services.billing.delivery import EdgeDelivery
from services.billing.payments import Charge, PaymentDeclined, TestProvider
from services.billing.service import BillingService
from services.billing.store import BillingStore
from services.edge import Overrides
from services.runtime.platform.outbox_relay import OutboxRelay
from services.runtime.platform.settings import Settings
from tests.conftest import opened_pool
from tests.integration.quota_helpers import SettableClock, eventually
from tests.integration.test_keys_api import PASSWORD, signup
from tests.support.apps import running_app

pytestmark = pytest.mark.integration


class Provider(TestProvider):
    """The test provider, refusing the payer while `declines` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.declines = False

    async def charge(self, order_id: UUID, account_id: UUID, amount: Decimal, currency: str) -> Charge:
        if self.declines:
            self.attempts += 1
            raise PaymentDeclined("card declined")
        return await super().charge(order_id, account_id, amount, currency)


@asynccontextmanager
async def replica(app: FastAPI, settings: Settings, provider: Provider, clock: SettableClock) -> AsyncIterator[BillingService]:
    """A billing replica's use cases beside the app's: its own pool and outbox relay, the app's edge."""
    runtime = app.state.runtime
    async with opened_pool(settings.database_url) as pool:
        relay = OutboxRelay(pool, settings, "billing")
        await relay.open()
        try:
            yield BillingService(
                BillingStore(pool),
                relay,
                runtime.edge.accounts,
                provider,
                clock,
                settings.tz,
                edge=EdgeDelivery(relay, runtime.edge),
            )
        finally:
            await relay.stop()


async def test_two_replicas_at_a_period_start_make_one_paid_renewal_with_its_invoice_and_audit(settings):
    clock, provider = SettableClock(), Provider()
    _, _, end = bounds_of(datetime.now(UTC), settings.tz)
    clock.fixed = end - timedelta(hours=1)  # the last hour of this period: the sessions outlive its end
    async with running_app(settings, overrides=Overrides(clock=clock, payment_provider=provider)) as (app, client):
        _, paying_console = await signup(client)
        _, free_console = await signup(client)
        switched = await client.post("/api/billing/subscription/switch", json={"plan": "basic"}, headers=paying_console)
        assert switched.status_code == 402, switched.text
        upgrade = switched.json()["error"]["details"]["order"]
        paid = await client.post(f"/api/billing/orders/{upgrade['id']}/pay", headers=paying_console)
        assert paid.status_code == 200, paid.text
        ordered = await client.post("/api/billing/subscription/switch", json={"plan": "basic"}, headers=free_console)
        assert ordered.status_code == 402  # ordered and never paid: still on free

        clock.fixed = end + timedelta(seconds=30)  # the next period has begun
        async with AsyncExitStack() as stack:
            a = await stack.enter_async_context(replica(app, settings, provider, clock))
            b = await stack.enter_async_context(replica(app, settings, provider, clock))
            assert sorted(await asyncio.gather(a.renew_all(), b.renew_all())) == [0, 1]
            assert await a.renew_all() == 0 and await b.renew_all() == 0

        orders = (await client.get("/api/billing/orders", headers=paying_console)).json()["items"]
        assert [(o["kind"], o["status"], o["plan"], o["amount"]) for o in orders] == [
            ("plan_renewal", "paid", "basic", "9.90"),
            ("plan_upgrade", "paid", "basic", upgrade["amount"]),
        ]
        renewal = orders[0]
        assert datetime.fromisoformat(renewal["period"]["start"]) == end
        assert provider.attempts == 2 and len(provider.charges) == 2  # the upgrade's and one renewal's
        invoices = [(await client.get(f"/api/billing/orders/{o['id']}/invoice", headers=paying_console)).json() for o in orders]
        numbers = sorted(int(i["number"].rsplit("-", 1)[1]) for i in invoices)
        assert numbers[1] == numbers[0] + 1  # gapless per seller
        assert invoices[0]["total"] == "9.90" and "basic plan, period" in invoices[0]["lines"][0]["description"]
        free_orders = (await client.get("/api/billing/orders", headers=free_console)).json()["items"]
        assert [o["kind"] for o in free_orders] == ["plan_upgrade"]

        async def audited() -> list[tuple[str, bool]] | None:
            response = await client.get("/api/audit-log", params={"limit": 50}, headers=paying_console)
            assert response.status_code == 200, response.text
            mine = [i for i in response.json()["items"] if i["target"]["id"] == renewal["id"]]
            found = sorted((i["action"], i["actor"] == {"operator": True}) for i in mine)
            return found if len(found) >= 2 else None

        assert await eventually(audited) == [("order.created", True), ("order.paid", True)]
        assert (await client.get("/api/billing/subscription", headers=paying_console)).json()["plan"] == "basic"


async def test_a_renewal_declined_to_the_end_of_its_grace_puts_the_account_on_free(settings):
    clock, provider = SettableClock(), Provider()
    _, _, end = bounds_of(datetime.now(UTC), settings.tz)
    clock.fixed = end - timedelta(hours=1)
    async with running_app(settings, overrides=Overrides(clock=clock, payment_provider=provider)) as (app, client):
        email = f"renew-{uuid4().hex[:8]}@example.com"
        _, console = await signup(client, email)
        switched = await client.post("/api/billing/subscription/switch", json={"plan": "professional"}, headers=console)
        paid = await client.post(f"/api/billing/orders/{switched.json()['error']['details']['order']['id']}/pay", headers=console)
        assert paid.status_code == 200, paid.text

        provider.declines = True
        async with replica(app, settings, provider, clock) as job:
            clock.fixed = end + timedelta(seconds=30)
            assert await job.renew_all() == 0
            [renewal] = [
                o
                for o in (await client.get("/api/billing/orders", headers=console)).json()["items"]
                if o["kind"] == "plan_renewal"
            ]
            assert renewal["status"] == "pending"
            assert (await client.get("/api/billing/subscription", headers=console)).json()["plan"] == "professional"

            clock.fixed = end + domain.GRACE + timedelta(seconds=30)
            assert await job.renew_all() == 0  # the last attempt, declined: the plan ends
            assert provider.attempts > 2 and len(provider.charges) == 1  # retried, never charged

        login = await client.post("/api/auth/login", json={"email": email, "password": PASSWORD})  # a new session now
        console = {"Authorization": f"Bearer {login.json()['access_token']}"}
        assert (await client.get("/api/billing/subscription", headers=console)).json()["plan"] == "free"
        [renewal] = [
            o for o in (await client.get("/api/billing/orders", headers=console)).json()["items"] if o["kind"] == "plan_renewal"
        ]
        assert renewal["status"] == "pending"
        refused = await client.post(f"/api/billing/orders/{renewal['id']}/pay", headers=console)
        assert refused.status_code == 409, refused.text  # a lapsed renewal is never charged

        async def switched_to_free() -> list[dict] | None:
            response = await client.get("/api/audit-log", params={"action": "plan.switched"}, headers=console)
            return response.json()["items"] or None

        [entry] = await eventually(switched_to_free)
        assert entry["actor"] == {"operator": True} and entry["details"]["reason"] == "renewal_unpaid"


async def test_the_plan_held_at_a_period_start_survives_changes_in_the_period(pool):
    """The SQL behind a late job's renewal: the first plan change of a period keeps the plan held
    at its start; one changed before the start is its own start plan."""
    tz = UTC
    october, november, december = (datetime(2026, m, 1, tzinfo=tz) for m in (10, 11, 12))
    account = uuid4()
    async with BillingStore(pool).transaction() as tx:
        await tx.lock_account(account, UserType.INDIVIDUAL, None, 0)
        await tx.set_plan(account, Tier.BASIC, october + timedelta(days=9), "2026-10")
        assert await tx.start_plan(account, "2026-10", october) is Tier.FREE
        await tx.set_plan(account, Tier.PROFESSIONAL, november + timedelta(days=2), "2026-11")
        await tx.set_plan(account, Tier.FREE, november + timedelta(days=4), "2026-11")
        assert await tx.start_plan(account, "2026-11", november) is Tier.BASIC
        assert await tx.start_plan(account, "2026-12", december) is Tier.FREE
        assert await tx.renewal_candidates("2026-11") == [account]  # on free now, on basic at November's start
        assert await tx.renewal_candidates("2026-12") == []
        # A change in the period from before start plans were recorded: unknown, not renewed then.
        await tx.conn.execute(
            "UPDATE billing.accounts SET start_plan = NULL, start_plan_period = NULL WHERE account_id = %s", (account,)
        )
        assert await tx.start_plan(account, "2026-11", november) is None


async def test_a_deleted_account_is_no_renewal_candidate_and_its_row_says_so(pool):
    """The SQL behind never renewing an ended account (accounts.v1 `deleted`): kept once heard, the
    first time kept, and a row made for an account billing never saw."""
    november = datetime(2026, 11, 1, tzinfo=UTC)
    account, never_seen = uuid4(), uuid4()
    async with BillingStore(pool).transaction() as tx:
        await tx.lock_account(account, UserType.INDIVIDUAL, None, 0)
        await tx.set_plan(account, Tier.BASIC, november - timedelta(days=20), "2026-10")
        assert account in await tx.renewal_candidates("2026-11")
        await tx.mark_account_deleted(account, UserType.INDIVIDUAL, november - timedelta(days=2))
        await tx.mark_account_deleted(account, UserType.INDIVIDUAL, november)  # heard again: the first end stays
        assert account not in await tx.renewal_candidates("2026-11")
        row = await tx.lock_account(account, UserType.INDIVIDUAL, None, 0)
        assert (row.plan, row.deleted_at) == (Tier.BASIC, november - timedelta(days=2))
        await tx.mark_account_deleted(never_seen, UserType.ENTERPRISE, november)
        row = await tx.lock_account(never_seen, UserType.INDIVIDUAL, None, 0)
        assert (row.plan, row.user_type, row.deleted_at) == (Tier.FREE, UserType.ENTERPRISE, november)
