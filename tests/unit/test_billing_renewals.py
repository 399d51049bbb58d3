"""The renewal job on fakes (tests/unit/fakes.py): each period's start charges every account on a
paid plan the full monthly price of the plan it held then, once; a declined charge is retried with
backoff for the grace period, then the account goes to free; the grace only for an account that
paid the plan's (or a dearer one's) renewal for the period before: any other goes to free at the
first decline (docs/api.md, "Renewals")."""

import json
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from prometheus_client import REGISTRY

from contracts.billing_api import Order, PlanUpgradeOrderIn
from contracts.common import Tier, UserType
from contracts.domain_errors import Conflict, PaymentRequired
from contracts.events import AccountState, PlanChanged
from contracts.plans import catalogue
from services.billing import domain
from services.billing.store import OrderRow
from tests.unit.fakes import (
    ACTOR,
    BillingWorld,
    audit_entries,
)

TZ = ZoneInfo("UTC")
OCTOBER = datetime(2026, 10, 10, 12, 0, tzinfo=UTC)
NOVEMBER = datetime(2026, 11, 1, 0, 0, 30, tzinfo=UTC)  # the job's first pass of November
SEPTEMBER = datetime(2026, 9, 10, 12, 0, tzinfo=UTC)


class World(BillingWorld):
    def __init__(self) -> None:
        super().__init__(OCTOBER, TZ)

    async def upgrade(self, tier: Tier, account: uuid.UUID | None = None) -> None:
        """The account orders and pays an upgrade to `tier` now (the prorated difference)."""
        account = account or self.account
        order = await self.service.create_order(account, PlanUpgradeOrderIn(kind="plan_upgrade", plan=tier), audit=ACTOR)
        await self.service.pay(account, order.id, audit=ACTOR)

    async def paying_customer(self, tier: Tier, account: uuid.UUID | None = None) -> None:
        """The account upgraded in September and paid October's renewal in full: it has earned the
        grace of a declined renewal. The clock is back at OCTOBER."""
        self.clock.now = SEPTEMBER
        await self.upgrade(tier, account)
        self.clock.now = datetime(2026, 10, 1, 0, 0, 30, tzinfo=UTC)
        await self.service.renew_all()
        assert [(o.period, o.status) for o in self.renewals(account)] == [("2026-10", "paid")]
        self.clock.now = OCTOBER

    def renewals(self, account: uuid.UUID | None = None) -> list[OrderRow]:
        mine = [o for o in self.store.state.orders.values() if o.kind == "plan_renewal"]
        return sorted((o for o in mine if o.account_id == (account or self.account)), key=lambda o: o.created_at)

    def plan(self) -> Tier:
        return self.store.state.accounts[self.account].plan

    def events(self) -> list[dict[str, object]]:
        return [json.loads(v or b"{}") for t, _, v in self.outbox.events if t == "billing.v1"]


@pytest.fixture
def world() -> World:
    return World()


async def test_a_new_period_charges_the_full_monthly_price_once_with_its_invoice_and_audit_entries(world):
    await world.upgrade(Tier.PROFESSIONAL)  # in October: the prorated difference only
    world.outbox.events.clear()
    world.clock.now = NOVEMBER

    assert await world.service.renew_all() == 1
    [renewal] = world.renewals()
    assert (renewal.kind, renewal.status, renewal.plan, renewal.period) == ("plan_renewal", "paid", Tier.PROFESSIONAL, "2026-11")
    assert renewal.amount == Decimal("49.00") and world.provider.charges[renewal.id] == (Decimal("49.00"), "USD")
    invoice = world.store.state.invoices[renewal.id]
    assert invoice.number == 2  # after October's upgrade: one gapless counter per seller
    lines = domain.invoice_lines(world.service._out(renewal))
    assert [(line.description, line.amount) for line in lines] == [("professional plan, period 2026-11", Decimal("49.00"))]
    entries = audit_entries(world.outbox.events)
    assert [e.action.value for e in entries] == ["order.created", "order.paid"]
    assert all(e.actor.operator and e.actor.user_id is None and e.target.id == str(renewal.id) for e in entries)
    assert world.events() == [] and world.plan() is Tier.PROFESSIONAL  # the plan goes on: nothing to publish

    world.clock.advance(hours=5)
    assert await world.service.renew_all() == 0  # once per account and period
    assert len(world.renewals()) == 1 and world.provider.attempts == 2  # October's upgrade and this renewal
    listed = await world.service.list_orders(world.account, 10, None)
    assert [o.kind for o in listed.items] == ["plan_renewal", "plan_upgrade"]


async def test_an_account_on_free_gets_nothing(world):
    await world.service.switch(world.account, Tier.FREE, audit=ACTOR)
    other = uuid.uuid4()
    await world.upgrade(Tier.BASIC, other)
    await world.service.switch(other, Tier.FREE, audit=ACTOR)  # a downgrade in October: free since
    world.clock.now = NOVEMBER
    assert await world.service.renew_all() == 0
    assert world.renewals() == [] and world.renewals(other) == []


async def test_an_upgrade_from_free_in_the_period_pays_its_proration_and_renews_from_the_next_period(world):
    world.clock.now = NOVEMBER + timedelta(days=9)
    await world.upgrade(Tier.BASIC)
    assert await world.service.renew_all() == 0 and world.renewals() == []  # on free at November's start
    world.clock.now = datetime(2026, 12, 1, 0, 1, tzinfo=UTC)
    assert await world.service.renew_all() == 1
    assert [(o.period, o.plan, o.amount) for o in world.renewals()] == [("2026-12", Tier.BASIC, Decimal("9.90"))]


async def test_an_upgrade_after_the_renewal_pays_the_difference_and_the_next_renewal_the_new_full_price(world):
    await world.upgrade(Tier.BASIC)
    world.clock.now = NOVEMBER
    await world.service.renew_all()
    world.clock.now = datetime(2026, 11, 16, tzinfo=UTC)  # 15 of November's 30 days left
    order = await world.service.create_order(
        world.account, PlanUpgradeOrderIn(kind="plan_upgrade", plan=Tier.PROFESSIONAL), audit=ACTOR
    )
    assert order.amount == ((Decimal("49.00") - Decimal("9.90")) / 2).quantize(Decimal("0.01"))
    await world.service.pay(world.account, order.id, audit=ACTOR)
    assert await world.service.renew_all() == 0  # November is renewed already

    world.clock.now = datetime(2026, 12, 1, 0, 1, tzinfo=UTC)
    await world.service.renew_all()
    assert [(o.period, o.plan, o.amount, o.status) for o in world.renewals()] == [
        ("2026-11", Tier.BASIC, Decimal("9.90"), "paid"),
        ("2026-12", Tier.PROFESSIONAL, Decimal("49.00"), "paid"),
    ]


async def test_a_downgrade_is_immediate_and_the_next_renewal_charges_the_lower_plan(world):
    await world.upgrade(Tier.PROFESSIONAL)
    world.clock.now = NOVEMBER
    await world.service.renew_all()
    world.clock.now = datetime(2026, 11, 20, tzinfo=UTC)
    await world.service.switch(world.account, Tier.BASIC, audit=ACTOR)
    assert world.plan() is Tier.BASIC  # at once, nothing refunded
    world.clock.now = datetime(2026, 12, 1, 0, 1, tzinfo=UTC)
    await world.service.renew_all()
    assert [(o.plan, o.amount) for o in world.renewals()] == [
        (Tier.PROFESSIONAL, Decimal("49.00")),
        (Tier.BASIC, Decimal("9.90")),
    ]


async def test_a_late_job_charges_the_plan_held_at_the_period_start(world):
    """The job was down at November's start; the account downgraded on the 3rd (or upgraded:
    paying the difference from its start plan): the renewal is of the plan it held on the 1st."""
    await world.upgrade(Tier.PROFESSIONAL)
    other = uuid.uuid4()
    await world.upgrade(Tier.BASIC, other)
    world.clock.now = datetime(2026, 11, 3, tzinfo=UTC)
    await world.service.switch(world.account, Tier.FREE, audit=ACTOR)
    await world.upgrade(Tier.PROFESSIONAL, other)
    world.clock.advance(hours=1)
    assert await world.service.renew_all() == 2
    assert [(o.plan, o.amount) for o in world.renewals()] == [(Tier.PROFESSIONAL, Decimal("49.00"))]
    assert [(o.plan, o.amount) for o in world.renewals(other)] == [(Tier.BASIC, Decimal("9.90"))]
    assert world.plan() is Tier.FREE  # a renewal changes no plan


async def test_after_two_missed_periods_only_the_current_one_is_charged(world):
    await world.upgrade(Tier.BASIC)  # October, then the job is down all of November
    world.clock.now = datetime(2026, 12, 14, tzinfo=UTC)
    assert await world.service.renew_all() == 1
    assert [o.period for o in world.renewals()] == ["2026-12"]


async def test_a_declined_charge_stays_pending_and_is_retried_with_backoff_until_paid(world):
    await world.paying_customer(Tier.BASIC)
    world.provider.declines = True
    world.clock.now = NOVEMBER
    assert await world.service.renew_all() == 0
    [_, renewal] = world.renewals()
    assert (renewal.status, renewal.attempts, renewal.next_attempt_at) == ("pending", 1, NOVEMBER + timedelta(hours=1))
    assert [e.action.value for e in audit_entries(world.outbox.events)][-1] == "order.created"

    world.clock.advance(minutes=59)
    await world.service.renew_all()
    assert world.provider.attempts == 3  # not due yet: September's upgrade, October's renewal and the first attempt
    world.clock.advance(minutes=1)
    await world.service.renew_all()
    [_, renewal] = world.renewals()
    assert (renewal.attempts, renewal.next_attempt_at) == (2, world.clock.now + timedelta(hours=2))

    world.provider.declines = False
    world.clock.advance(hours=2)
    assert await world.service.renew_all() == 1
    [_, renewal] = world.renewals()
    assert renewal.status == "paid" and renewal.id in world.store.state.invoices and world.plan() is Tier.BASIC


async def test_unpaid_at_the_end_of_the_grace_the_account_goes_to_free_like_a_downgrade(world):
    await world.paying_customer(Tier.PROFESSIONAL)
    world.outbox.events.clear()
    world.provider.declines = True
    world.clock.now = NOVEMBER
    lapsed_before = REGISTRY.get_sample_value("tollgate_billing_renewals_total", {"outcome": "lapsed"})
    while world.clock.now < NOVEMBER + domain.GRACE:
        await world.service.renew_all()
        assert world.plan() is Tier.PROFESSIONAL  # the plan holds through the grace
        world.clock.advance(minutes=30)
    attempts = world.provider.attempts
    assert attempts < 15  # backed off: not one charge every pass

    await world.service.renew_all()  # the last attempt, at the grace's end
    [_, renewal] = world.renewals()
    assert renewal.status == "pending" and renewal.lapsed_at == world.clock.now and world.plan() is Tier.FREE
    assert REGISTRY.get_sample_value("tollgate_billing_renewals_total", {"outcome": "lapsed"}) == lapsed_before + 1
    [changed] = world.events()
    assert (changed["type"], changed["plan"], changed["previous_plan"]) == ("plan_changed", "free", "professional")
    assert isinstance(world.edge.delivered[-1][0], PlanChanged)
    switched = audit_entries(world.outbox.events)[-1]
    assert switched.action.value == "plan.switched" and switched.actor.operator
    assert switched.details["plan"] == "free" and switched.details["reason"] == "renewal_unpaid"

    world.provider.declines = False
    world.clock.advance(days=1)
    assert await world.service.renew_all() == 0 and world.provider.attempts == attempts + 1  # never charged again
    with pytest.raises(Conflict):
        await world.service.pay(world.account, renewal.id, audit=ACTOR)


async def test_a_failing_provider_is_retried_and_never_ends_a_plan(world):
    await world.upgrade(Tier.BASIC)
    world.provider.fails = True
    world.clock.now = NOVEMBER
    for _ in range(10):
        await world.service.renew_all()
        world.clock.advance(hours=12)
    [renewal] = world.renewals()
    assert renewal.status == "pending" and renewal.lapsed_at is None and world.plan() is Tier.BASIC
    world.provider.fails = False
    world.clock.advance(hours=12)
    assert await world.service.renew_all() == 1


async def test_the_customer_may_pay_a_declined_renewal_during_the_grace(world):
    await world.paying_customer(Tier.BASIC)
    world.provider.declines = True
    world.clock.now = NOVEMBER
    await world.service.renew_all()
    assert world.plan() is Tier.BASIC  # in the grace
    world.provider.declines = False
    [_, renewal] = world.renewals()
    world.outbox.events.clear()
    paid = await world.service.pay(world.account, renewal.id, audit=ACTOR)
    assert paid.status == "paid" and paid.kind == "plan_renewal"
    assert world.plan() is Tier.BASIC and world.events() == []  # the plan went on: nothing to publish
    world.clock.advance(hours=2)
    assert await world.service.renew_all() == 0 and len(world.provider.charges) == 3  # the upgrade and two renewals


async def test_the_enterprise_tier_renews_for_an_enterprise_account(world):
    world.accounts.states[world.account] = AccountState(
        time=OCTOBER, account_id=world.account, roles=[], user_type=UserType.ENTERPRISE
    )
    await world.upgrade(Tier.ENTERPRISE)
    world.clock.now = NOVEMBER
    assert await world.service.renew_all() == 1
    [renewal] = world.renewals()
    assert (renewal.plan, renewal.amount) == (Tier.ENTERPRISE, Decimal("199.00")) and world.plan() is Tier.ENTERPRISE
    assert world.store.state.invoices[renewal.id].buyer["user_type"] == "enterprise"


def test_the_retry_backoff_doubles_up_to_its_cap_and_ends_at_the_grace():
    made = NOVEMBER
    order = OrderRow(
        uuid.uuid4(),
        uuid.uuid4(),
        "plan_renewal",
        "pending",
        Decimal("9.90"),
        "USD",
        Tier.BASIC,
        None,
        None,
        None,
        "2026-11",
        made,
        None,
    )
    delays = []
    now = made
    for attempts in range(9):
        nxt = domain.next_attempt(OrderRow(**{**order.__dict__, "attempts": attempts}), now)
        delays.append(nxt - now)
        now = nxt
    hours = [d / timedelta(hours=1) for d in delays]
    assert hours[:5] == [1, 2, 4, 8, 12] and now == made + domain.GRACE


def test_the_order_schema_names_the_renewal_kind():
    kind = Order.model_json_schema()["properties"]["kind"]
    assert kind["enum"] == ["plan_upgrade", "quota_package", "plan_renewal"] and "beyond the contract" in kind["description"]


async def test_a_declined_payment_by_the_customer_is_402_with_the_order_still_pending(world):
    """Before, the provider's refusal reached the client as a 500."""
    order = await world.service.create_order(world.account, PlanUpgradeOrderIn(kind="plan_upgrade", plan=Tier.BASIC), audit=ACTOR)
    world.provider.declines = True
    with pytest.raises(PaymentRequired) as declined:
        await world.service.pay(world.account, order.id, audit=ACTOR)
    assert declined.value.code == "payment_required" and declined.value.details["order"]["status"] == "pending"
    assert world.store.state.orders[order.id].status == "pending" and world.plan() is Tier.FREE
    world.provider.declines = False
    assert (await world.service.pay(world.account, order.id, audit=ACTOR)).status == "paid"


async def test_a_deleted_account_is_never_renewed(world):
    """accounts.v1 holds the account deleted (a restore's reconcile: docs/backup.md): its paid plan
    is not charged again, although billing's row still says professional."""
    await world.upgrade(Tier.PROFESSIONAL)
    attempts = world.provider.attempts
    deleted = AccountState(
        time=OCTOBER, account_id=world.account, roles=[], user_type=UserType.INDIVIDUAL, deleted=True, version=2
    )
    await world.service.apply_user_type(deleted)
    world.clock.now = NOVEMBER
    assert await world.service.renew_all() == 0
    assert world.renewals() == [] and world.provider.attempts == attempts


async def test_a_renewal_pending_when_its_account_is_deleted_is_never_charged_again(world):
    await world.paying_customer(Tier.BASIC)
    world.provider.declines = True
    world.clock.now = NOVEMBER
    await world.service.renew_all()  # declined: pending, tried again in an hour
    attempts = world.provider.attempts
    deleted = AccountState(
        time=NOVEMBER, account_id=world.account, roles=[], user_type=UserType.INDIVIDUAL, deleted=True, version=2
    )
    await world.service.apply_user_type(deleted)
    world.provider.declines = False
    world.clock.advance(hours=2)
    assert await world.service.renew_all() == 0 and world.provider.attempts == attempts
    [_, renewal] = world.renewals()
    assert renewal.status == "pending" and renewal.lapsed_at is not None  # ended unpaid: never charged again
    world.clock.advance(days=4)
    assert await world.service.renew_all() == 0 and world.provider.attempts == attempts


# ---- the grace is earned: only by the full price paid for the period before (docs/api.md, "Renewals") ----
def enterprise(world: World) -> None:
    world.accounts.states[world.account] = AccountState(
        time=OCTOBER, account_id=world.account, roles=[], user_type=UserType.ENTERPRISE
    )


def no_grace_count() -> float:
    return REGISTRY.get_sample_value("tollgate_billing_renewals_total", {"outcome": "no_grace"}) or 0.0


async def test_a_free_upgrade_in_a_period_last_minute_then_a_declined_renewal_is_free_at_once_and_never_charged(world):
    """The exploit (fresheyes S2): free -> enterprise 30 s before October ends costs 0.00 (no
    provider call), November's renewal is declined, and the grace gave 3 days of enterprise and
    its whole period's quota (100M ai_tokens) with nothing ever charged. Now: free at the first
    decline, and the job does not try the card again."""
    enterprise(world)
    world.clock.now = datetime(2026, 10, 31, 23, 59, 30, tzinfo=UTC)
    await world.service.switch(world.account, Tier.ENTERPRISE, audit=ACTOR)
    [upgrade] = [o for o in world.store.state.orders.values() if o.kind == "plan_upgrade"]
    assert (upgrade.amount, upgrade.status, world.plan()) == (Decimal("0.00"), "paid", Tier.ENTERPRISE)
    assert world.provider.attempts == 0
    world.outbox.events.clear()
    world.provider.declines = True
    no_grace_before = no_grace_count()

    world.clock.now = NOVEMBER
    assert await world.service.renew_all() == 0
    assert world.plan() is Tier.FREE  # at once, not 3 days later
    [renewal] = world.renewals()
    assert (renewal.status, renewal.lapsed_at, renewal.plan_dropped_at, renewal.next_attempt_at) == (
        "pending",
        None,
        NOVEMBER,
        None,
    )
    assert no_grace_count() == no_grace_before + 1
    [changed] = world.events()
    assert (changed["type"], changed["plan"], changed["previous_plan"]) == ("plan_changed", "free", "enterprise")
    assert isinstance(world.edge.delivered[-1][0], PlanChanged) and world.edge.delivered[-1][0].plan is Tier.FREE
    switched = audit_entries(world.outbox.events)[-1]
    assert switched.action.value == "plan.switched" and switched.actor.operator
    assert switched.details == {
        "plan": "free",
        "previous_plan": "enterprise",
        "reason": "renewal_unpaid",
        "order_id": str(renewal.id),
    }

    while world.clock.now < NOVEMBER + domain.GRACE + timedelta(days=1):  # the job does not retry it
        world.clock.advance(hours=1)
        assert await world.service.renew_all() == 0
    assert world.provider.attempts == 1 and world.provider.charges == {}  # nothing was ever charged
    assert world.plan() is Tier.FREE


async def test_a_mid_period_upgrade_then_a_declined_renewal_goes_to_free_at_once(world):
    """An honest upgrade in October paid a proration, not October: no 3 days of November's quota
    on credit."""
    await world.upgrade(Tier.PROFESSIONAL)  # October the 10th: about two thirds of the price
    world.provider.declines = True
    world.clock.now = NOVEMBER
    await world.service.renew_all()
    [renewal] = world.renewals()
    assert world.plan() is Tier.FREE and renewal.plan_dropped_at == NOVEMBER and renewal.lapsed_at is None


async def test_a_cheaper_plan_renewed_then_a_last_minute_upgrade_earns_no_grace_on_the_dearer_plan(world):
    """9.90 a month for basic, then basic -> enterprise in October's last minute (0.00): November's
    enterprise renewal declined is no 3 days of enterprise."""
    enterprise(world)
    await world.paying_customer(Tier.BASIC)
    world.clock.now = datetime(2026, 10, 31, 23, 59, 30, tzinfo=UTC)
    await world.service.switch(world.account, Tier.ENTERPRISE, audit=ACTOR)
    world.provider.declines = True
    world.clock.now = NOVEMBER
    await world.service.renew_all()
    [_, renewal] = world.renewals()
    assert (renewal.plan, renewal.plan_dropped_at) == (Tier.ENTERPRISE, NOVEMBER) and world.plan() is Tier.FREE


async def test_a_paying_customer_keeps_the_grace_and_so_after_a_downgrade(world):
    """October's renewal paid: a declined November renewal keeps the plan through the grace, as
    before; so does one of a cheaper plan after a downgrade in October (a dearer one was paid)."""
    await world.paying_customer(Tier.BASIC)
    downgraded = uuid.uuid4()
    await world.paying_customer(Tier.PROFESSIONAL, downgraded)
    await world.service.switch(downgraded, Tier.BASIC, audit=ACTOR)  # October the 10th, nothing refunded
    world.provider.declines = True
    world.clock.now = NOVEMBER
    no_grace_before = no_grace_count()
    for _ in range(3):
        await world.service.renew_all()
        world.clock.advance(hours=3)
    for account in (world.account, downgraded):
        [_, renewal] = world.renewals(account)
        assert (renewal.plan, renewal.status, renewal.plan_dropped_at, renewal.lapsed_at) == (Tier.BASIC, "pending", None, None)
        assert renewal.attempts == 3 and renewal.next_attempt_at is not None  # still tried
        assert world.store.state.accounts[account].plan is Tier.BASIC
    assert no_grace_count() == no_grace_before


async def test_paying_a_renewal_declined_with_no_grace_puts_its_plan_back(world):
    """The order stays payable in the console: paying it charges the full price and puts the plan
    back at once (plan_changed, delivered to the edge before the answer); the period then counts as
    paid, so December's renewal has its grace."""
    await world.upgrade(Tier.PROFESSIONAL)
    world.provider.declines = True
    world.clock.now = NOVEMBER
    await world.service.renew_all()
    assert world.plan() is Tier.FREE
    [renewal] = world.renewals()
    world.clock.advance(hours=5)
    with pytest.raises(PaymentRequired):  # declined in the console too: still pending, still free
        await world.service.pay(world.account, renewal.id, audit=ACTOR)
    assert world.plan() is Tier.FREE

    world.provider.declines = False
    world.outbox.events.clear()
    paid = await world.service.pay(world.account, renewal.id, audit=ACTOR)
    assert (paid.status, paid.amount, world.plan()) == ("paid", Decimal("49.00"), Tier.PROFESSIONAL)
    assert world.provider.charges[renewal.id] == (Decimal("49.00"), "USD") and renewal.id in world.store.state.invoices
    [changed] = world.events()
    assert (changed["type"], changed["plan"], changed["previous_plan"]) == ("plan_changed", "professional", "free")
    assert world.edge.delivered[-1][0].plan is Tier.PROFESSIONAL
    assert [e.action.value for e in audit_entries(world.outbox.events)] == ["order.paid"]
    again = await world.service.pay(world.account, renewal.id, audit=ACTOR)  # paying twice: no second charge
    assert again.status == "paid" and len(world.provider.charges) == 2 and world.plan() is Tier.PROFESSIONAL

    world.provider.declines = True
    world.clock.now = datetime(2026, 12, 1, 0, 0, 30, tzinfo=UTC)
    await world.service.renew_all()
    [_, december] = world.renewals()
    assert december.plan_dropped_at is None and december.next_attempt_at is not None and world.plan() is Tier.PROFESSIONAL


async def test_a_renewal_declined_with_no_grace_does_not_override_a_plan_chosen_since(world):
    """Put on free, the customer ordered basic instead: the professional renewal no longer fits the
    account (409, nothing charged); and an enterprise renewal needs an enterprise account still."""
    await world.upgrade(Tier.PROFESSIONAL)
    world.provider.declines = True
    world.clock.now = NOVEMBER
    await world.service.renew_all()
    [renewal] = world.renewals()
    world.provider.declines = False
    world.clock.advance(days=1)
    await world.upgrade(Tier.BASIC)
    charges = len(world.provider.charges)
    with pytest.raises(Conflict):
        await world.service.pay(world.account, renewal.id, audit=ACTOR)
    assert world.plan() is Tier.BASIC and len(world.provider.charges) == charges
    assert world.store.state.orders[renewal.id].status == "pending"

    other = uuid.uuid4()
    world.accounts.states[other] = AccountState(time=OCTOBER, account_id=other, roles=[], user_type=UserType.ENTERPRISE)
    world.clock.now = OCTOBER
    await world.upgrade(Tier.ENTERPRISE, other)
    world.provider.declines = True
    world.clock.now = NOVEMBER
    await world.service.renew_all()
    [dropped] = world.renewals(other)
    world.accounts.states[other] = AccountState(
        time=NOVEMBER, account_id=other, roles=[], user_type=UserType.INDIVIDUAL, version=2
    )
    world.provider.declines = False
    with pytest.raises(Conflict) as mismatch:
        await world.service.pay(other, dropped.id, audit=ACTOR)
    assert mismatch.value.code == "user_type_plan_mismatch" and world.store.state.accounts[other].plan is Tier.FREE


def test_the_grace_is_earned_by_the_period_before_paid_in_full_for_the_same_or_a_dearer_plan():
    plans = catalogue()
    basic, professional, top = plans[Tier.BASIC], plans[Tier.PROFESSIONAL], plans[Tier.ENTERPRISE]
    assert domain.grace_earned(basic, basic) and domain.grace_earned(basic, professional)
    assert not domain.grace_earned(top, professional) and not domain.grace_earned(basic, None)
    assert [domain.previous_period(p) for p in ("2026-11", "2026-01", "2027-12")] == ["2026-10", "2025-12", "2027-11"]
