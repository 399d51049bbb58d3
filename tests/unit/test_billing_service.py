"""Billing's use cases on fakes (tests/unit/fakes.py): orders, payment, switch, Idempotency-Key."""

import json
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest

from contracts.billing_api import Package, PackageOrderIn, PlanUpgradeOrderIn
from contracts.common import Resource, Tier, UserType
from contracts.domain_errors import Conflict, Invalid, NotFound, PaymentRequired
from contracts.events import AccountState, PackagePurchased, PlanChanged
from contracts.period import period_bounds
from contracts.plans import catalogue
from services.billing import domain
from tests.unit.fakes import (
    ACTOR,
    BillingWorld,
)

TZ = ZoneInfo("UTC")
NOW = datetime(2026, 11, 11, 0, 0, tzinfo=UTC)  # 20 of November's 30 days left
PACKAGE = PackageOrderIn(kind="quota_package", package=Package(resource=Resource.AI_TOKENS, amount=300_000))
BASIC = PlanUpgradeOrderIn(kind="plan_upgrade", plan=Tier.BASIC)


class World(BillingWorld):
    def __init__(self) -> None:
        super().__init__(NOW, TZ)

    def event_types(self) -> list[str]:
        return [json.loads(value or b"{}")["type"] for topic, _, value in self.outbox.events if topic == "billing.v1"]

    def enterprise(self) -> None:
        self.accounts.states[self.account] = AccountState(
            time=NOW, account_id=self.account, roles=[], user_type=UserType.ENTERPRISE
        )


@pytest.fixture
def world() -> World:
    return World()


async def test_a_plan_upgrade_costs_the_price_difference_over_the_rest_of_the_period(world):
    order = await world.service.create_order(world.account, BASIC, audit=ACTOR)
    start, end = period_bounds("2026-11", TZ)
    assert order.status == "pending" and order.kind == "plan_upgrade" and order.previous_plan is Tier.FREE
    assert order.amount == (Decimal("9.90") * 20 / 30).quantize(Decimal("0.01")) == Decimal("6.60")
    assert (order.period.start, order.period.end) == (start, end)
    assert world.provider.attempts == 0 and world.event_types() == []


async def test_a_quota_package_costs_its_units_times_the_unit_price(world):
    order = await world.service.create_order(world.account, PACKAGE, audit=ACTOR)
    assert order.amount == Decimal("3.00") and order.package == PACKAGE.package and order.currency == "USD"


async def test_an_individual_account_cannot_order_or_switch_to_enterprise(world):
    enterprise = PlanUpgradeOrderIn(kind="plan_upgrade", plan=Tier.ENTERPRISE)
    with pytest.raises(domain.UserTypePlanMismatch) as ordered:
        await world.service.create_order(world.account, enterprise, audit=ACTOR)
    assert isinstance(ordered.value, Conflict) and ordered.value.code == "user_type_plan_mismatch"
    with pytest.raises(domain.UserTypePlanMismatch):
        await world.service.switch(world.account, Tier.ENTERPRISE, audit=ACTOR)
    assert world.store.state.orders == {}
    world.enterprise()  # the edge's projection knows better than billing's row: it is used
    assert (await world.service.create_order(world.account, enterprise, audit=ACTOR)).plan is Tier.ENTERPRISE


async def test_an_order_to_a_cheaper_plan_is_a_conflict(world):
    await world.service.switch(world.account, Tier.FREE, audit=ACTOR)
    with pytest.raises(Conflict):
        await world.service.create_order(world.account, PlanUpgradeOrderIn(kind="plan_upgrade", plan=Tier.FREE), audit=ACTOR)


async def test_paying_charges_once_and_applies_the_effect(world):
    upgrade = await world.service.create_order(world.account, BASIC, audit=ACTOR)
    paid = await world.service.pay(world.account, upgrade.id, audit=ACTOR)
    assert paid.status == "paid" and paid.paid_at == NOW
    assert world.store.state.accounts[world.account].plan is Tier.BASIC
    assert world.provider.charges == {upgrade.id: (Decimal("6.60"), "USD")}
    assert world.event_types() == ["plan_changed"]

    again = await world.service.pay(world.account, upgrade.id, audit=ACTOR)
    assert again == paid and world.provider.attempts == 1 and world.event_types() == ["plan_changed"]

    package = await world.service.create_order(world.account, PACKAGE, audit=ACTOR)
    await world.service.pay(world.account, package.id, audit=ACTOR)
    assert world.event_types() == ["plan_changed", "package_purchased"] and world.provider.attempts == 2


async def test_a_payment_or_a_switch_answers_once_its_event_is_delivered_to_this_process(world):
    """Issue #41 (8): the caller's next call is judged by the new totals, so the use case hands
    the events it published to this process's edge (after Kafka's ack) before it answers."""
    upgrade = await world.service.create_order(world.account, BASIC, audit=ACTOR)
    await world.service.pay(world.account, upgrade.id, audit=ACTOR)
    [[plan]] = world.edge.delivered
    assert isinstance(plan, PlanChanged) and plan.plan is Tier.BASIC and plan.quotas == catalogue()[Tier.BASIC].quotas

    package = await world.service.create_order(world.account, PACKAGE, audit=ACTOR)
    await world.service.pay(world.account, package.id, audit=ACTOR)
    bought = world.edge.delivered[-1][0]
    assert isinstance(bought, PackagePurchased) and (bought.resource, bought.amount, bought.order_id) == (
        Resource.AI_TOKENS,
        300_000,
        package.id,
    )
    # Paying again charges nothing and publishes nothing, but still waits for Kafka: its event
    # may still be in the outbox (the first answer was a 503), and a 200 says it is in force.
    await world.service.pay(world.account, package.id, audit=ACTOR)
    assert world.edge.delivered[-1] == []

    await world.service.switch(world.account, Tier.FREE, audit=ACTOR)  # a downgrade: at once too
    [down] = world.edge.delivered[-1]
    assert isinstance(down, PlanChanged) and (down.plan, down.previous_plan) == (Tier.FREE, Tier.BASIC)
    assert [json.loads(v or b"{}")["id"] for t, _, v in world.outbox.events if t == "billing.v1"] == [
        str(e.id) for [e] in (world.edge.delivered[0], world.edge.delivered[1], world.edge.delivered[3])
    ]


async def test_another_accounts_order_is_not_found_and_a_stale_order_is_a_conflict(world):
    order = await world.service.create_order(world.account, BASIC, audit=ACTOR)
    with pytest.raises(NotFound):
        await world.service.pay(uuid.uuid4(), order.id, audit=ACTOR)
    world.clock.now = datetime(2026, 12, 2, tzinfo=UTC)  # the order's period is over
    with pytest.raises(Conflict):
        await world.service.pay(world.account, order.id, audit=ACTOR)
    assert world.provider.attempts == 0 and world.event_types() == []


async def test_an_upgrade_by_switch_needs_a_paid_order_and_a_downgrade_does_not(world):
    with pytest.raises(PaymentRequired) as needed:
        await world.service.switch(world.account, Tier.BASIC, audit=ACTOR)
    order = needed.value.details["order"]
    assert order["status"] == "pending" and order["amount"] == "6.60" and order["plan"] == "basic"
    assert world.store.state.accounts[world.account].plan is Tier.FREE and world.event_types() == []

    await world.service.pay(world.account, uuid.UUID(order["id"]), audit=ACTOR)
    down = await world.service.switch(world.account, Tier.FREE, audit=ACTOR)  # costs nothing: applied at once
    assert down.plan is Tier.FREE and world.store.state.accounts[world.account].plan is Tier.FREE
    assert world.event_types() == ["plan_changed", "plan_changed"] and world.provider.attempts == 1


async def test_a_retried_request_replays_the_first_answer_and_a_reused_key_is_refused(world):
    key = domain.Idempotency.of("k1", "POST /api/billing/orders", "/api/billing/orders", PACKAGE.model_dump(mode="json"))
    first = await world.service.create_order(world.account, PACKAGE, key, audit=ACTOR)
    assert await world.service.create_order(world.account, PACKAGE, key, audit=ACTOR) == first
    assert len(world.store.state.orders) == 1

    other = domain.Idempotency.of("k1", "POST /api/billing/orders", "/api/billing/orders", BASIC.model_dump(mode="json"))
    with pytest.raises(domain.KeyReused) as reused:
        await world.service.create_order(world.account, BASIC, other, audit=ACTOR)
    assert isinstance(reused.value, Conflict) and reused.value.code == "idempotency_key_reused"
    assert len(world.store.state.orders) == 1

    # A refused request is not remembered: the key stays free for a corrected retry.
    bad = PackageOrderIn(kind="quota_package", package=Package(resource=Resource.AI_TOKENS, amount=15))
    k2 = domain.Idempotency.of("k2", "POST /api/billing/orders", "/api/billing/orders", PACKAGE.model_dump(mode="json"))
    with pytest.raises(domain.InvalidPackage):
        await world.service.create_order(world.account, bad, k2, audit=ACTOR)
    assert (await world.service.create_order(world.account, PACKAGE, k2, audit=ACTOR)).id != first.id

    pay = domain.Idempotency.of("p1", "POST /api/billing/orders/{order_id}/pay", f"/api/billing/orders/{first.id}/pay")
    paid = await world.service.pay(world.account, first.id, pay, audit=ACTOR)
    assert await world.service.pay(world.account, first.id, pay, audit=ACTOR) == paid and world.provider.attempts == 1


async def test_subscription_and_user_type_facts(world):
    subscription = await world.service.subscription(world.account)
    assert subscription.plan is Tier.FREE and subscription.user_type is UserType.INDIVIDUAL
    assert subscription.period.start == datetime(2026, 11, 1, tzinfo=TZ)
    later = AccountState(time=NOW, account_id=world.account, roles=[], user_type=UserType.ENTERPRISE)
    await world.service.apply_user_type(later)
    older = AccountState(time=datetime(2026, 1, 1, tzinfo=UTC), account_id=world.account, roles=[], user_type=UserType.INDIVIDUAL)
    await world.service.apply_user_type(older)  # reordered: the later fact stands
    assert (await world.service.subscription(world.account)).user_type is UserType.ENTERPRISE


async def test_the_package_catalogue_lists_every_resource_with_its_unit_price(world):
    catalogue = world.service.packages()
    assert catalogue.currency == "USD"
    ai = next(i for i in catalogue.items if i.resource is Resource.AI_TOKENS)
    assert (ai.unit, ai.unit_price) == (100_000, Decimal("1.00"))
    assert {i.resource for i in catalogue.items} == set(Resource)


async def test_the_order_history_is_newest_first_by_keyset_and_only_the_accounts(world):
    made = []
    for _ in range(5):
        made.append(await world.service.create_order(world.account, PACKAGE, audit=ACTOR))
        world.clock.advance(minutes=1)
    await world.service.create_order(uuid.uuid4(), PACKAGE, audit=ACTOR)  # another account's: not listed
    seen, cursor = [], None
    while True:
        page = await world.service.list_orders(world.account, 2, cursor)
        seen += [o.id for o in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == [o.id for o in reversed(made)]
    assert (await world.service.get_order(world.account, made[0].id)) == made[0]
    with pytest.raises(NotFound):
        await world.service.get_order(uuid.uuid4(), made[0].id)
    with pytest.raises(Invalid):
        await world.service.list_orders(world.account, 2, "not-a-cursor")


async def test_a_paid_order_has_an_invoice_numbered_without_gaps(world):
    first = await world.service.create_order(world.account, PACKAGE, audit=ACTOR)
    with pytest.raises(Conflict):
        await world.service.invoice(world.account, first.id)  # pending: no invoice yet
    await world.service.pay(world.account, first.id, audit=ACTOR)
    upgrade = await world.service.create_order(world.account, BASIC, audit=ACTOR)
    world.clock.now = datetime(2026, 12, 2, tzinfo=UTC)
    with pytest.raises(Conflict):  # a refused payment takes no number
        await world.service.pay(world.account, upgrade.id, audit=ACTOR)
    world.clock.now = NOW
    await world.service.pay(world.account, upgrade.id, audit=ACTOR)
    await world.service.pay(world.account, upgrade.id, audit=ACTOR)  # paid already: no second invoice

    one = await world.service.invoice(world.account, first.id)
    two = await world.service.invoice(world.account, upgrade.id)
    assert (one.number, two.number) == ("TG-000001", "TG-000002")
    assert one.total == Decimal("3.00") and one.currency == "USD" and one.issued_at == NOW
    assert [(line.quantity, line.unit_price, line.amount) for line in one.lines] == [(3, Decimal("1.00"), Decimal("3.00"))]
    assert two.lines[0].amount == two.total == Decimal("6.60") and "basic" in two.lines[0].description
    assert one.buyer.account_id == world.account and one.seller.name
    with pytest.raises(NotFound):
        await world.service.invoice(uuid.uuid4(), first.id)


ENTERPRISE = PlanUpgradeOrderIn(kind="plan_upgrade", plan=Tier.ENTERPRISE)


async def test_the_user_type_of_record_decides_the_enterprise_tier_not_billings_copy(world):
    """Keys owns the user type: billing's copies of it (its row, the edge's accounts.v1) may still
    say enterprise after keys has made the account individual. Order, payment and switch judge by
    the user type of record, read under keys' row lock."""
    world.enterprise()
    order = await world.service.create_order(world.account, ENTERPRISE, audit=ACTOR)
    world.store.state.user_types_of_record[world.account] = UserType.INDIVIDUAL  # keys' change, committed first
    with pytest.raises(domain.UserTypePlanMismatch):
        await world.service.pay(world.account, order.id, audit=ACTOR)
    with pytest.raises(domain.UserTypePlanMismatch):
        await world.service.create_order(world.account, ENTERPRISE, audit=ACTOR)
    with pytest.raises(domain.UserTypePlanMismatch):
        await world.service.switch(world.account, Tier.ENTERPRISE, audit=ACTOR)
    assert world.provider.attempts == 0 and world.store.state.accounts[world.account].plan is Tier.FREE
    assert world.store.state.plans_in_keys == {}


async def test_a_plan_put_in_force_is_recorded_in_keys_row_with_its_version(world):
    """The user-type change that waited for this payment judges by the plan recorded in keys'
    row, not by keys' billing.v1 consumer's older copy."""
    world.store.state.user_types_of_record[world.account] = UserType.ENTERPRISE
    order = await world.service.create_order(world.account, ENTERPRISE, audit=ACTOR)
    await world.service.pay(world.account, order.id, audit=ACTOR)
    assert world.store.state.plans_in_keys[world.account] == (Tier.ENTERPRISE, NOW, 1)
    await world.service.switch(world.account, Tier.FREE, audit=ACTOR)
    assert world.store.state.plans_in_keys[world.account] == (Tier.FREE, NOW, 2)


# ---- an upgrade whose prorated price rounds to 0.00 leaves its record like any other ----------------
LAST_MINUTES = datetime(2026, 11, 30, 23, 56, tzinfo=UTC)  # 4 minutes left: 49.00 x 240 / 2,592,000 s = 0.0045


def _audit_actions(world: World) -> list[str]:
    return [json.loads(value or b"{}")["action"] for topic, _, value in world.outbox.events if topic == "audit.v1"]


async def test_an_upgrade_by_switch_that_prorates_to_zero_is_ordered_paid_and_invoiced_at_once(world):
    world.clock.now = LAST_MINUTES
    switched = await world.service.switch(world.account, Tier.PROFESSIONAL, audit=ACTOR)  # 200: nothing to pay

    assert switched.plan is Tier.PROFESSIONAL and world.store.state.accounts[world.account].plan is Tier.PROFESSIONAL
    [order] = (await world.service.list_orders(world.account, 10, None)).items
    assert (order.kind, order.status, order.amount, order.currency) == ("plan_upgrade", "paid", Decimal("0.00"), "USD")
    assert (order.plan, order.previous_plan, order.created_at, order.paid_at) == (
        Tier.PROFESSIONAL,
        Tier.FREE,
        LAST_MINUTES,
        LAST_MINUTES,
    )
    invoice = await world.service.invoice(world.account, order.id)
    assert invoice.total == Decimal("0.00") and [line.amount for line in invoice.lines] == [Decimal("0.00")]
    assert _audit_actions(world) == ["order.created", "order.paid"]  # as a paid upgrade gets
    assert world.event_types() == ["plan_changed"]
    [[fact]] = world.edge.delivered
    assert isinstance(fact, PlanChanged) and (fact.plan, fact.previous_plan) == (Tier.PROFESSIONAL, Tier.FREE)
    assert world.provider.attempts == 0  # nothing to charge: a real provider refuses a zero charge


async def test_a_zero_priced_upgrade_order_is_paid_without_a_charge_and_invoiced(world):
    world.clock.now = LAST_MINUTES
    order = await world.service.create_order(world.account, BASIC, audit=ACTOR)
    assert order.amount == Decimal("0.00") and order.status == "pending"
    paid = await world.service.pay(world.account, order.id, audit=ACTOR)
    assert paid.status == "paid" and world.store.state.accounts[world.account].plan is Tier.BASIC
    assert (await world.service.invoice(world.account, order.id)).total == Decimal("0.00")
    assert _audit_actions(world) == ["order.created", "order.paid"] and world.provider.attempts == 0


async def test_a_downgrade_switches_at_once_with_no_order(world):
    await world.service.switch(world.account, Tier.FREE, audit=ACTOR)  # unchanged: nothing recorded
    world.store.state.accounts[world.account] = replace(world.store.state.accounts[world.account], plan=Tier.BASIC)
    world.clock.now = LAST_MINUTES
    await world.service.switch(world.account, Tier.FREE, audit=ACTOR)
    assert world.store.state.orders == {} and _audit_actions(world) == ["plan.switched"]
