"""Renewals (docs/api.md, "Renewals") on real Postgres and Kafka: at a period's start the renewal
job makes one paid `plan_renewal` order of the full monthly price, with its invoice and its
`order.created`/`order.paid` audit entries, for an account on a paid plan and nothing for one on
free; two replicas running the job at the same instant make one order and one charge. A renewal
of an account that paid the period before, declined to the end of its grace, puts the account on
free, in force at the edge; one with no paid period behind it (a 0.00 upgrade in the period's last
minute) puts it on free at its first decline, and paying it then puts the plan back."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from uuid import UUID, uuid4

import httpx
import pytest
from fastapi import FastAPI

from contracts.common import Tier, UserType
from contracts.period import bounds_of
from services.billing import domain
from services.billing.delivery import EdgeDelivery
from services.billing.payments import Charge, PaymentDeclined, TestProvider
from services.billing.service import BillingService
from services.billing.store import BillingStore, OrderRow
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


async def session(client: httpx.AsyncClient, email: str) -> dict[str, str]:
    """A console session started now (the clock moved past the last one's 8 hours)."""
    login = await client.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    assert login.status_code == 200, login.text
    return {"Authorization": f"Bearer {login.json()['access_token']}"}


async def renewals_of(client: httpx.AsyncClient, console: dict[str, str]) -> list[dict]:
    orders = (await client.get("/api/billing/orders", headers=console)).json()["items"]
    return [o for o in orders if o["kind"] == "plan_renewal"]


async def plan_of(client: httpx.AsyncClient, console: dict[str, str]) -> str:
    return str((await client.get("/api/billing/subscription", headers=console)).json()["plan"])


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
    """The account paid the next period's renewal, so the one after, declined, has its grace."""
    clock, provider = SettableClock(), Provider()
    _, _, start = bounds_of(datetime.now(UTC), settings.tz)  # the next period's (sessions are not made in the past)
    _, _, end = bounds_of(start, settings.tz)
    clock.fixed = start - timedelta(hours=1)
    async with running_app(settings, overrides=Overrides(clock=clock, payment_provider=provider)) as (app, client):
        email = f"renew-{uuid4().hex[:8]}@example.com"
        _, console = await signup(client, email)
        switched = await client.post("/api/billing/subscription/switch", json={"plan": "professional"}, headers=console)
        assert switched.status_code == 402, switched.text
        paid = await client.post(f"/api/billing/orders/{switched.json()['error']['details']['order']['id']}/pay", headers=console)
        assert paid.status_code == 200, paid.text

        async with replica(app, settings, provider, clock) as job:
            clock.fixed = start + timedelta(seconds=30)
            assert await job.renew_all() == 1  # the period's renewal, paid in full: the next one's grace earned

            provider.declines = True
            clock.fixed = end + timedelta(seconds=30)
            assert await job.renew_all() == 0
            console = await session(client, email)
            [renewal, _] = await renewals_of(client, console)
            assert renewal["status"] == "pending"
            assert await plan_of(client, console) == "professional"  # in the grace

            clock.fixed = end + domain.GRACE + timedelta(seconds=30)
            assert await job.renew_all() == 0  # the last attempt, declined: the plan ends
            assert provider.attempts > 3 and len(provider.charges) == 2  # retried, never charged

        console = await session(client, email)
        assert await plan_of(client, console) == "free"
        [renewal, _] = await renewals_of(client, console)
        assert renewal["status"] == "pending"
        refused = await client.post(f"/api/billing/orders/{renewal['id']}/pay", headers=console)
        assert refused.status_code == 409, refused.text  # a lapsed renewal is never charged

        async def switched_to_free() -> list[dict] | None:
            response = await client.get("/api/audit-log", params={"action": "plan.switched"}, headers=console)
            return response.json()["items"] or None

        [entry] = await eventually(switched_to_free)
        assert entry["actor"] == {"operator": True} and entry["details"]["reason"] == "renewal_unpaid"


async def test_a_free_last_minute_upgrade_then_a_declined_renewal_is_free_at_once_and_paying_it_puts_the_plan_back(
    settings, pool
):
    """The exploit (fresheyes S2) through the API: free -> professional 30 s before the period ends
    costs 0.00, the next period's renewal is declined: free at once (not 3 days of professional
    with a whole period's quota), the card not tried again; the order stays payable, and paying it
    puts professional back."""
    clock, provider = SettableClock(), Provider()
    _, _, end = bounds_of(datetime.now(UTC), settings.tz)
    clock.fixed = end - timedelta(seconds=30)
    async with running_app(settings, overrides=Overrides(clock=clock, payment_provider=provider)) as (app, client):
        email = f"free-upgrade-{uuid4().hex[:8]}@example.com"
        _, console = await signup(client, email)
        switched = await client.post("/api/billing/subscription/switch", json={"plan": "professional"}, headers=console)
        assert switched.status_code == 200, switched.text  # 0.00: paid at once, no provider call
        [upgrade] = (await client.get("/api/billing/orders", headers=console)).json()["items"]
        assert (upgrade["amount"], upgrade["status"], provider.attempts) == ("0.00", "paid", 0)

        provider.declines = True
        async with replica(app, settings, provider, clock) as job:
            clock.fixed = end + timedelta(seconds=30)
            assert await job.renew_all() == 0
            assert await plan_of(client, console) == "free"  # at the first decline
            [renewal] = await renewals_of(client, console)
            assert (renewal["status"], renewal["amount"]) == ("pending", "49.00")
            clock.fixed = end + domain.GRACE + timedelta(hours=1)
            assert await job.renew_all() == 0
            assert provider.attempts == 1 and provider.charges == {}  # never tried again, nothing charged

        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT attempts, next_attempt_at, lapsed_at, plan_dropped_at FROM billing.orders WHERE id = %s",
                (UUID(renewal["id"]),),
            )
            row = await cur.fetchone()
        assert (row["attempts"], row["next_attempt_at"], row["lapsed_at"]) == (1, None, None)
        assert row["plan_dropped_at"] == end + timedelta(seconds=30)

        provider.declines = False
        console = await session(client, email)
        paid = await client.post(f"/api/billing/orders/{renewal['id']}/pay", headers=console)
        assert paid.status_code == 200, paid.text
        assert paid.json()["status"] == "paid" and await plan_of(client, console) == "professional"
        assert len(provider.charges) == 1
        invoice = await client.get(f"/api/billing/orders/{renewal['id']}/invoice", headers=console)
        assert invoice.status_code == 200 and invoice.json()["total"] == "49.00"

        async def switched() -> list[dict] | None:
            response = await client.get("/api/audit-log", params={"action": "plan.switched"}, headers=console)
            return response.json()["items"] or None

        [entry] = await eventually(switched)
        assert entry["details"]["reason"] == "renewal_unpaid" and entry["details"]["previous_plan"] == "professional"


async def test_the_paid_renewal_of_the_period_before_is_found_and_a_dropped_renewal_is_never_due(pool):
    """The SQL behind the earned grace and the renewal declined without it."""
    november = datetime(2026, 11, 1, tzinfo=UTC)
    account = uuid4()
    store = BillingStore(pool)
    async with store.transaction() as tx:
        await tx.lock_account(account, UserType.INDIVIDUAL, None, 0)
        ids = []
        for period, made in (("2026-10", november - timedelta(days=31)), ("2026-11", november)):
            order = OrderRow(
                uuid4(),
                account,
                "plan_renewal",
                "pending",
                Decimal("49.00"),
                "USD",
                Tier.PROFESSIONAL,
                None,
                None,
                None,
                period,
                made,
                None,
                next_attempt_at=made,
            )
            assert await tx.insert_renewal(order)
            ids.append(order.id)
        assert await tx.paid_renewal_plan(account, "2026-10") is None  # pending is not paid
        await tx.mark_paid(ids[0], november - timedelta(days=30), "ref")
        assert await tx.paid_renewal_plan(account, "2026-10") is Tier.PROFESSIONAL
        assert await tx.paid_renewal_plan(account, "2026-11") is None and await tx.paid_renewal_plan(uuid4(), "2026-10") is None
        assert (ids[1], account) in await tx.due_renewals(november)
        await tx.drop_renewal(ids[1], november)
        assert (ids[1], account) not in await tx.due_renewals(november + timedelta(days=5))
        dropped = await tx.lock_order(ids[1], account)
        assert dropped is not None
        assert (dropped.status, dropped.attempts, dropped.next_attempt_at, dropped.lapsed_at, dropped.plan_dropped_at) == (
            "pending",
            1,
            None,
            None,
            november,
        )


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
