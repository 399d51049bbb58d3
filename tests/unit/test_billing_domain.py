"""Billing rules alone: the version-12 rule, proration (property-tested) and package prices."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.common import Resource, Tier, UserType
from contracts.period import period_bounds
from contracts.plans import catalogue
from services.billing import domain

START = datetime(2026, 2, 1, tzinfo=UTC)
END = datetime(2026, 3, 1, tzinfo=UTC)
prices = st.decimals(min_value=0, max_value=10_000, places=2)
moments = st.integers(min_value=0, max_value=int((END - START).total_seconds() * 1_000_000)).map(
    lambda us: START + timedelta(microseconds=us)
)


def test_individual_users_cannot_have_the_enterprise_tier_but_enterprise_users_can():
    with pytest.raises(domain.UserTypePlanMismatch) as raised:
        domain.ensure_plan_allowed(UserType.INDIVIDUAL, Tier.ENTERPRISE)
    assert raised.value.code == "user_type_plan_mismatch" and "user type" in raised.value.message
    domain.ensure_plan_allowed(UserType.ENTERPRISE, Tier.ENTERPRISE)
    for tier in (Tier.FREE, Tier.BASIC, Tier.PROFESSIONAL):
        domain.ensure_plan_allowed(UserType.INDIVIDUAL, tier)


def test_a_switch_checks_the_rule_before_anything_else():
    plans = catalogue()
    with pytest.raises(domain.UserTypePlanMismatch):
        domain.classify_switch(UserType.INDIVIDUAL, plans[Tier.FREE], plans[Tier.ENTERPRISE], Decimal("0"))
    assert (
        domain.classify_switch(UserType.INDIVIDUAL, plans[Tier.BASIC], plans[Tier.FREE], Decimal("0"))
        is domain.SwitchKind.IMMEDIATE
    )
    assert (
        domain.classify_switch(UserType.INDIVIDUAL, plans[Tier.BASIC], plans[Tier.BASIC], Decimal("0"))
        is domain.SwitchKind.UNCHANGED
    )
    kind = domain.classify_switch(UserType.INDIVIDUAL, plans[Tier.FREE], plans[Tier.BASIC], Decimal("1.00"))
    assert kind is domain.SwitchKind.NEEDS_PAYMENT
    # An upgrade whose prorated amount rounds to 0.00 (the last minutes of a period) is still an
    # upgrade: ordered and paid at once, with its invoice, never a silent switch.
    kind = domain.classify_switch(UserType.INDIVIDUAL, plans[Tier.FREE], plans[Tier.PROFESSIONAL], Decimal("0.00"))
    assert kind is domain.SwitchKind.FREE_UPGRADE


def test_proration_examples():
    mid = datetime(2026, 2, 15, tzinfo=UTC)  # 14 of 28 days left
    assert domain.prorate(Decimal("9.90"), Decimal("49.00"), mid, START, END) == Decimal("19.55")
    assert domain.prorate(Decimal("0"), Decimal("9.90"), START, START, END) == Decimal("9.90")
    assert domain.prorate(Decimal("0"), Decimal("9.90"), END, START, END) == Decimal("0.00")
    assert domain.prorate(Decimal("49.00"), Decimal("9.90"), mid, START, END) == Decimal("0.00")


@pytest.mark.parametrize("month", ["2026-03", "2026-10"])  # 743 and 745 real hours in Berlin
def test_proration_counts_real_time_in_a_month_with_a_dst_change(month):
    berlin = ZoneInfo("Europe/Berlin")
    start, end = period_bounds(month, berlin)
    hours = Decimal(int((end.astimezone(UTC) - start.astimezone(UTC)).total_seconds()) // 3600)
    assert domain.prorate(Decimal("0"), hours, start, start, end) == hours  # the whole month: the whole price
    halfway = start.astimezone(UTC) + (end.astimezone(UTC) - start.astimezone(UTC)) / 2
    assert domain.prorate(Decimal("0"), hours, halfway, start, end) == hours / 2


@given(old=prices, new=prices, now=moments)
def test_proration_is_the_difference_times_the_remaining_fraction_rounded_once(old, new, now):
    amount = domain.prorate(old, new, now, START, END)
    assert amount == amount.quantize(Decimal("0.01"))
    assert Decimal("0") <= amount <= max(new - old, Decimal("0"))
    exact = (
        max(new - old, Decimal("0"))
        * Decimal((END - now) // timedelta(microseconds=1))
        / Decimal((END - START) // timedelta(microseconds=1))
    )
    assert abs(amount - exact) <= Decimal("0.005")  # one rounding, never two


@given(old=prices, new=prices, a=moments, b=moments)
def test_a_later_upgrade_never_costs_more(old, new, a, b):
    early, late = min(a, b), max(a, b)
    assert domain.prorate(old, new, late, START, END) <= domain.prorate(old, new, early, START, END)


def test_package_prices_come_from_the_data_file_and_need_whole_units():
    assert domain.package_amount(Resource.AI_TOKENS, 300_000) == Decimal("3.00")
    assert domain.package_amount(Resource.API_CALLS, 10_000) == Decimal("2.00")
    with pytest.raises(domain.BillingRuleError):
        domain.package_amount(Resource.API_CALLS, 5)
    assert set(domain.package_prices()) == set(Resource)
