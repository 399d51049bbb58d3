"""The quota gate's two questions: `is_blocked` only answers, `admit_call` answers and counts;
and its totals, from billing.v1 when it has spoken of the account."""

import random
import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from contracts.common import Resource, Tier
from contracts.events import PackagePurchased, PlanChanged, QuotaState
from contracts.period import period_of
from contracts.plans import catalogue
from services.edge.billing_totals import BillingTotals
from services.edge.projections import PlanLimits
from services.edge.quota_gate import QuotaProjection

T0 = datetime(2026, 3, 10, tzinfo=UTC)


def _state(account: uuid.UUID, used: int, total: int, at: datetime = T0, period: str = "2026-03") -> QuotaState:
    return QuotaState(
        time=at, account_id=account, resource=Resource.API_CALLS, period=period, total=total, used=used, blocked=used >= total
    )


def test_is_blocked_records_nothing_however_often_it_is_asked():
    gate, a = QuotaProjection(ZoneInfo("UTC")), uuid.uuid4()
    gate.apply(_state(a, used=3, total=5))
    for i in range(10):
        assert not gate.is_blocked(a, Resource.API_CALLS, T0 + timedelta(seconds=i))
    assert gate.pending_calls(a) == 0
    assert [gate.admit_call(a, T0 + timedelta(seconds=i)) for i in range(3)] == [True, True, False]
    assert gate.pending_calls(a) == 2  # the refused one is not counted
    assert gate.is_blocked(a, Resource.API_CALLS, T0 + timedelta(seconds=4))  # 3 counted + 2 admitted here


def test_admissions_of_a_past_period_count_neither_for_the_question_nor_for_admission():
    gate, a = QuotaProjection(ZoneInfo("UTC")), uuid.uuid4()
    gate.apply(_state(a, used=4, total=5))
    assert gate.admit_call(a, T0) and not gate.admit_call(a, T0)
    april = datetime(2026, 4, 1, tzinfo=UTC)
    assert not gate.is_blocked(a, Resource.API_CALLS, april)  # a new period: the flow starts again
    assert gate.pending_calls(a) == 1  # the question changed nothing
    assert [gate.admit_call(a, april) for _ in range(6)] == [True] * 5 + [False]
    assert gate.pending_calls(a) == 5


def test_a_state_covering_admissions_replaces_them():
    gate, a = QuotaProjection(ZoneInfo("UTC")), uuid.uuid4()
    gate.apply(_state(a, used=0, total=3))
    assert all(gate.admit_call(a, T0 + timedelta(seconds=i)) for i in (1, 2, 3))
    assert not gate.admit_call(a, T0 + timedelta(seconds=4))
    gate.apply(_state(a, used=2, total=3, at=T0 + timedelta(seconds=2)))  # quota counted the first two
    assert gate.pending_calls(a) == 1 and gate.is_blocked(a, Resource.API_CALLS, T0 + timedelta(seconds=5))
    gate.apply(_state(a, used=3, total=10, at=T0 + timedelta(seconds=3)))  # and the third; an upgrade
    assert gate.pending_calls(a) == 0 and gate.admit_call(a, T0 + timedelta(seconds=6))


def test_the_memoised_period_is_period_of_for_any_order_of_instants_around_month_ends():
    tz = ZoneInfo("America/Sao_Paulo")
    gate = QuotaProjection(tz)
    edges = [datetime(2026, m, 1, 3, tzinfo=UTC) for m in range(1, 13)] + [datetime(2027, 1, 1, 3, tzinfo=UTC)]
    instants = [e + timedelta(microseconds=d) for e in edges for d in (-3_600_000_001, -1, 0, 1, 7_200_000_000)]
    rng = random.Random(3)
    for now in instants + rng.sample(instants, len(instants)):  # in order, then jumping back and forth
        assert gate._period(now) == period_of(now, tz), now


def test_one_process_admits_exactly_the_total_whatever_order_quota_counts_its_calls_in():
    gate, a = QuotaProjection(ZoneInfo("UTC")), uuid.uuid4()
    gate.apply(_state(a, used=0, total=3))
    assert [gate.admit_call(a, T0 + timedelta(seconds=i)) for i in (1, 2, 3, 4)] == [True, True, True, False]
    # Quota counted the third call first (the first two had slower handlers): its state's watermark
    # is past all three admissions, but it counted one. The two in flight keep their places.
    gate.apply(_state(a, used=1, total=3, at=T0 + timedelta(seconds=3)))
    assert gate.pending_calls(a) == 2 and not gate.admit_call(a, T0 + timedelta(seconds=5))
    # The first call ends refused by its handler (quota will not count it): its place is free again.
    gate.give_back(a, T0 + timedelta(seconds=1))
    assert gate.admit_call(a, T0 + timedelta(seconds=6)) and not gate.admit_call(a, T0 + timedelta(seconds=7))
    # A give-back of a past period changes nothing in this one.
    gate.give_back(a, T0 - timedelta(days=20))
    assert not gate.admit_call(a, T0 + timedelta(seconds=8))


def test_other_replicas_calls_in_used_still_count_this_process_admissions_after_the_watermark():
    gate, a = QuotaProjection(ZoneInfo("UTC")), uuid.uuid4()
    gate.apply(_state(a, used=0, total=5))
    assert gate.admit_call(a, T0 + timedelta(seconds=1))
    # quota counted 3 calls of other replicas (and not this one's yet): 3 used + 1 in flight here
    gate.apply(_state(a, used=3, total=5, at=T0 + timedelta(milliseconds=500)))
    assert gate.pending_calls(a) == 1
    assert [gate.admit_call(a, T0 + timedelta(seconds=2)) for _ in range(2)] == [True, False]


def _billed() -> tuple[QuotaProjection, PlanLimits, BillingTotals]:
    plans = PlanLimits()
    totals = BillingTotals(plans)
    return QuotaProjection(ZoneInfo("UTC"), totals), plans, totals


def _plan(account: uuid.UUID, tier: Tier, at: datetime, **quotas: int) -> PlanChanged:
    plan = catalogue()[tier]
    merged = {**plan.quotas, **{Resource(r): n for r, n in quotas.items()}}
    return PlanChanged(time=at, account_id=account, plan=tier, quotas=merged, rate_limit=plan.rate_limit)


def _package(account: uuid.UUID, resource: Resource, amount: int, period: str = "2026-03", order: uuid.UUID | None = None):
    return PackagePurchased(
        time=T0, account_id=account, resource=resource, amount=amount, period=period, order_id=order or uuid.uuid4()
    )


def test_a_plan_upgrade_is_in_force_as_soon_as_its_billing_event_is_applied():
    """Issue #41 (8): the total comes from billing.v1, not one quota.v1 round trip later; used and
    reserved stay quota's (and the calls admitted here and not yet counted)."""
    gate, plans, _ = _billed()
    a = uuid.uuid4()
    plans.apply(_plan(a, Tier.FREE, T0, api_calls=5))
    gate.apply(_state(a, used=5, total=5))
    assert gate.is_blocked(a, Resource.API_CALLS, T0) and not gate.admit_call(a, T0)
    plans.apply(_plan(a, Tier.BASIC, T0 + timedelta(seconds=1), api_calls=7))  # quota has not re-published yet
    assert not gate.is_blocked(a, Resource.API_CALLS, T0) and gate.calls_view(a, T0).total == 7
    assert [gate.admit_call(a, T0) for _ in range(3)] == [True, True, False]
    assert gate.standing(a, Resource.API_CALLS, T0) == (7, 7)


def test_a_downgrade_blocks_at_once_though_the_state_still_has_the_larger_total():
    gate, plans, _ = _billed()
    a = uuid.uuid4()
    plans.apply(_plan(a, Tier.BASIC, T0))
    gate.apply(_state(a, used=0, total=10))
    gate.apply(
        QuotaState(time=T0, account_id=a, resource=Resource.GEO_PROJECTS, period="2026-03", total=10, used=5, blocked=False)
    )
    assert not gate.is_blocked(a, Resource.GEO_PROJECTS, T0)
    plans.apply(_plan(a, Tier.FREE, T0 + timedelta(seconds=1)))
    assert gate.is_blocked(a, Resource.GEO_PROJECTS, T0) and gate.standing(a, Resource.GEO_PROJECTS, T0) == (5, 3)
    plans.apply(_plan(a, Tier.BASIC, T0 - timedelta(seconds=1)))  # an older plan change, delivered late: no effect
    assert gate.is_blocked(a, Resource.GEO_PROJECTS, T0)


def test_a_package_counts_once_in_its_own_period_on_top_of_the_plan():
    gate, _, totals = _billed()
    a = uuid.uuid4()
    gate.apply(QuotaState(time=T0, account_id=a, resource=Resource.GEO_PROJECTS, period="2026-03", total=3, used=3, blocked=True))
    assert gate.is_blocked(a, Resource.GEO_PROJECTS, T0)
    order = uuid.uuid4()
    totals.apply_package(_package(a, Resource.GEO_PROJECTS, 2, order=order))  # never changed plan: free's 3 + 2
    totals.apply_package(_package(a, Resource.GEO_PROJECTS, 2, order=order))  # delivered twice: one package
    totals.apply_package(_package(a, Resource.AI_TOKENS, 100_000))
    assert not gate.is_blocked(a, Resource.GEO_PROJECTS, T0) and gate.standing(a, Resource.GEO_PROJECTS, T0) == (3, 5)
    assert totals.total(a, Resource.AI_TOKENS, "2026-03") == catalogue()[Tier.FREE].quotas[Resource.AI_TOKENS] + 100_000
    april = datetime(2026, 4, 1, tzinfo=UTC)  # the package lapses with its period; the stock's level does not
    assert gate.standing(a, Resource.GEO_PROJECTS, april) == (3, 3) and gate.is_blocked(a, Resource.GEO_PROJECTS, april)
    assert totals.total(uuid.uuid4(), Resource.GEO_PROJECTS, "2026-03") is None  # billing said nothing: quota.v1's stands
