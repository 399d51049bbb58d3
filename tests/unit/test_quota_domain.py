"""Quota rules alone: periods (property-tested), rates and bands, crossings, counting, the gate."""

import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import given
from hypothesis import strategies as st

from contracts.common import Resource
from contracts.events import CallEvent, QuotaState, UsageEvent
from contracts.period import period_bounds, period_of
from services.edge.quota_gate import QuotaProjection
from services.quota import domain

ZONES = st.sampled_from([ZoneInfo("UTC"), ZoneInfo("Asia/Shanghai"), ZoneInfo("America/New_York"), ZoneInfo("Pacific/Chatham")])
MOMENTS = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC))


@given(moment=MOMENTS, tz=ZONES)
def test_a_moment_lies_within_the_bounds_of_its_period(moment, tz):
    period = period_of(moment, tz)
    start, end = period_bounds(period, tz)
    assert start <= moment < end
    assert start.astimezone(tz).day == 1 and start.astimezone(tz).hour == 0
    assert period_of(end, tz) > period  # the next period starts exactly at the end
    assert period_of(end - timedelta(microseconds=1), tz) == period


def test_the_period_turns_at_midnight_of_the_first_in_the_platform_zone():
    shanghai = ZoneInfo("Asia/Shanghai")
    assert period_of(datetime(2026, 10, 31, 15, 59, tzinfo=UTC), shanghai) == "2026-10"
    assert period_of(datetime(2026, 10, 31, 16, 0, tzinfo=UTC), shanghai) == "2026-11"
    assert period_bounds("2026-12", ZoneInfo("UTC"))[1] == datetime(2027, 1, 1, tzinfo=ZoneInfo("UTC"))


def test_rates_bands_and_exhaustion():
    assert domain.usage_rate(1, 3) == domain.usage_rate(1, 3).quantize(domain.Decimal("0.01"))
    assert float(domain.usage_rate(1, 3)) == 33.33
    assert float(domain.usage_rate(0, 0)) == 100.0
    assert [domain.band(domain.usage_rate(u, 100)) for u in (69, 70, 90, 91)] == ["green", "yellow", "yellow", "red"]
    assert domain.band(domain.Decimal("90.01")) == "red"
    assert domain.is_exhausted(100, 100) and not domain.is_exhausted(99, 100)


@given(mark=st.integers(0, 100), used=st.integers(0, 10_000), total=st.integers(1, 10_000))
def test_a_crossing_is_the_highest_whole_percent_above_the_mark(mark, used, total):
    crossed = domain.crossing(mark, used, total)
    pct = min(100, used * 100 // total)
    assert crossed == (pct if pct > mark and pct >= 1 else None)


def test_events_sum_per_account_resource_and_period_of_their_own_time():
    tz = ZoneInfo("UTC")
    a = uuid.uuid4()
    jan, feb = datetime(2026, 1, 31, 23, 59, tzinfo=UTC), datetime(2026, 2, 1, tzinfo=UTC)
    call = {"api_key_id": uuid.uuid4(), "method": "GET", "path": "/x", "ip": "1.1.1.1", "latency_ms": 1.0}
    events = [
        UsageEvent(time=jan, account_id=a, resource=Resource.GEO_PROJECTS, quantity=2, source="t"),
        UsageEvent(time=feb, account_id=a, resource=Resource.GEO_PROJECTS, quantity=-1, source="t"),
        CallEvent(time=feb, account_id=a, status=200, **call),
        CallEvent(time=feb, account_id=a, status=404, **call),
        CallEvent(time=feb, account_id=a, status=429, **call),  # refused by the edge: not counted
        # (v2) refused calls carry error_code (a handler's 403 too; folded ones a count): not counted
        CallEvent(time=feb, account_id=a, status=403, error_code="permission_denied", **call),
        CallEvent(time=feb, account_id=a, status=401, error_code="api_key_disabled", count=40, **call),
    ]
    got = {(d.resource, d.period): d.quantity for d in domain.deltas(events, tz)}
    assert got == {
        (Resource.GEO_PROJECTS, "2026-01"): 2,
        (Resource.GEO_PROJECTS, "2026-02"): -1,
        (Resource.API_CALLS, "2026-02"): 2,
    }


def test_the_gate_counts_its_own_admissions_until_a_state_covers_them():
    gate = QuotaProjection(ZoneInfo("UTC"))
    a = uuid.uuid4()
    t0 = datetime(2026, 3, 10, tzinfo=UTC)
    gate.apply(QuotaState(time=t0, account_id=a, resource=Resource.API_CALLS, period="2026-03", total=5, used=3, blocked=False))
    admitted = [gate.admit_call(a, t0 + timedelta(seconds=i)) for i in range(1, 5)]
    assert admitted == [True, True, False, False]  # 3 counted + 2 local = the limit, not more
    # quota counted the two calls: the state covers them, still 5 of 5.
    gate.apply(
        QuotaState(
            time=t0 + timedelta(seconds=2),
            account_id=a,
            resource=Resource.API_CALLS,
            period="2026-03",
            total=5,
            used=5,
            blocked=True,
        )
    )
    assert gate.pending_calls(a) == 0 and gate.is_blocked(a, Resource.API_CALLS, t0 + timedelta(seconds=5))
    # An upgrade's state unblocks at once; the new period too, without any event.
    gate.apply(
        QuotaState(
            time=t0 + timedelta(seconds=2),
            account_id=a,
            resource=Resource.API_CALLS,
            period="2026-03",
            total=50,
            used=5,
            blocked=False,
        )
    )
    assert not gate.is_blocked(a, Resource.API_CALLS, t0 + timedelta(seconds=6))
    gate.apply(
        QuotaState(
            time=t0 + timedelta(seconds=7),
            account_id=a,
            resource=Resource.AI_TOKENS,
            period="2026-03",
            total=5,
            used=5,
            blocked=True,
        )
    )
    assert gate.is_blocked(a, Resource.AI_TOKENS, t0 + timedelta(seconds=8))
    assert not gate.is_blocked(a, Resource.AI_TOKENS, datetime(2026, 4, 1, tzinfo=UTC))


def test_accounts_without_a_state_are_held_to_the_free_tier_by_local_counting():
    gate = QuotaProjection(ZoneInfo("UTC"))
    a = uuid.uuid4()
    now = datetime(2026, 3, 10, tzinfo=UTC)
    admitted = sum(gate.admit_call(a, now) for _ in range(1500))
    assert admitted == 1000


def test_crossings_are_announced_for_a_period_until_35_days_after_its_end():
    utc = ZoneInfo("UTC")
    feb = datetime(2027, 2, 1, tzinfo=UTC)  # January's end
    assert domain.announces("2027-01", feb + timedelta(days=35) - timedelta(microseconds=1), utc)
    assert not domain.announces("2027-01", feb + timedelta(days=35), utc)  # only history reaches it now
    assert domain.announces("2027-02", feb - timedelta(seconds=1), utc)  # an event a little ahead
