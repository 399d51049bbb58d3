"""Properties of quota, metering and billing rules not covered elsewhere: periods tile time,
crossings are announced once each and in order, counting is order-independent, the activity
cursor refuses garbage only with a 422, de-duplication keeps first occurrences, package prices
stay within what an order can hold."""

import base64
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from contracts.common import Resource
from contracts.events import CallEvent, UsageEvent
from contracts.period import period_bounds, period_of
from services.billing import domain as billing
from services.metering import domain as metering
from services.metering.domain import InvalidQuery
from services.quota import domain as quota

ZONES = st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Pacific/Chatham", "Pacific/Kiritimati"])
periods = st.tuples(st.integers(1971, 2200), st.integers(1, 12)).map(lambda ym: f"{ym[0]:04d}-{ym[1]:02d}")
moments = st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC))


# ---- quota: periods ------------------------------------------------------------------------------
@given(periods, ZONES)
def test_periods_tile_time_without_gaps_or_overlaps(period, zone):
    tz = ZoneInfo(zone)
    start, end = period_bounds(period, tz)
    assert start < end
    assert period_of(start, tz) == period
    assert period_of(end - timedelta(microseconds=1), tz) == period
    following = period_of(end, tz)
    assert following > period and period_bounds(following, tz)[0] == end


@given(moments, moments, ZONES)
def test_periods_are_ordered_like_the_moments(a, b, zone):
    tz = ZoneInfo(zone)
    if a <= b:
        assert period_of(a, tz) <= period_of(b, tz)


# ---- quota: crossings ------------------------------------------------------------------------------
@given(st.lists(st.integers(-50, 5_000), max_size=40), st.integers(1, 10_000))
def test_a_stream_of_usage_announces_each_percent_at_most_once_in_rising_order(increments, total):
    """The mark only rises, so every announced threshold is new; the last one is where usage peaked."""
    used = mark = 0
    announced: list[int] = []
    peak = 0
    for delta in increments:
        used += delta
        peak = max(peak, quota.percent_floor(used, total))
        pct = quota.crossing(mark, used, total)
        if pct is not None:
            announced.append(pct)
            mark = pct
    assert announced == sorted(set(announced))
    assert all(1 <= p <= 100 for p in announced)
    assert (announced[-1] if announced else 0) == peak


@given(st.integers(0, 10**9), st.integers(1, 10**9))
def test_rate_band_and_exhaustion_agree(used, total):
    rate = quota.usage_rate(used, total)
    assert quota.percent_floor(used, total) == min(100, int(Decimal(used) * 100 // total))
    assert (quota.band(rate) == "red") == (rate > 90)
    assert quota.is_exhausted(used, total) == (used >= total)
    if quota.is_exhausted(used, total):
        assert rate >= 100 and quota.band(rate) == "red"


def _events(account: uuid.UUID):
    usage = st.builds(
        lambda t, r, q: UsageEvent(time=t, account_id=account, resource=r, quantity=q, source="p"),
        moments,
        st.sampled_from(Resource),
        st.integers(-1000, 1000),
    )
    calls = st.builds(
        lambda t, status: CallEvent(
            time=t,
            account_id=account,
            api_key_id=uuid.uuid4(),
            method="GET",
            path="/x",
            status=status,
            ip="1.1.1.1",
            latency_ms=1,
        ),
        moments,
        st.sampled_from([200, 201, 204, 400, 401, 403, 404, 422, 429, 500, 503]),
    )
    return st.lists(usage | calls, max_size=30)


@given(st.data(), ZONES)
def test_counting_is_independent_of_order_and_batching(data, zone):
    tz = ZoneInfo(zone)
    events = data.draw(_events(uuid.uuid4()))

    def summed(batches):
        totals: dict[tuple, int] = {}
        for batch in batches:
            for d in quota.deltas(batch, tz):
                key = (d.account_id, d.resource, d.period)
                totals[key] = totals.get(key, 0) + d.quantity
        return {k: v for k, v in totals.items() if v}

    whole = summed([events])
    shuffled = data.draw(st.permutations(events))
    cut = data.draw(st.integers(0, len(events)))
    assert summed([shuffled[:cut], shuffled[cut:]]) == whole
    refused = sum(1 for e in events if isinstance(e, CallEvent) and e.status in (401, 403, 429))
    counted_calls = sum(v for (_, r, _), v in whole.items() if r is Resource.API_CALLS)
    reported = sum(e.quantity for e in events if isinstance(e, UsageEvent) and e.resource is Resource.API_CALLS)
    assert counted_calls == sum(1 for e in events if isinstance(e, CallEvent)) - refused + reported


# ---- metering ------------------------------------------------------------------------------------
@given(st.text(max_size=200) | st.binary(max_size=150).map(lambda b: base64.urlsafe_b64encode(b).decode()))
def test_any_cursor_string_is_a_cursor_or_a_422_never_a_crash(token):
    try:
        cursor = metering.Cursor.decode(token)
    except InvalidQuery as exc:
        assert exc.field == "cursor"
    else:
        assert 1900 < cursor.time.year < 2299  # ClickHouse can compare with it


@given(st.integers(-(10**30), 10**30), st.uuids())
def test_a_cursor_with_any_number_is_a_cursor_or_a_422(micros, ident):
    token = base64.urlsafe_b64encode(f"{micros}:{ident}".encode()).decode()
    try:
        metering.Cursor.decode(token)
    except InvalidQuery:
        pass


@given(st.datetimes(min_value=datetime(1901, 1, 1), max_value=datetime(2298, 1, 1), timezones=st.just(UTC)), st.uuids())
def test_cursors_round_trip(moment, ident):
    cursor = metering.Cursor(moment, ident)
    assert metering.Cursor.decode(cursor.encode()) == cursor


@given(st.lists(st.sampled_from([uuid.UUID(int=i) for i in range(6)]), max_size=20))
def test_deduplication_keeps_the_first_of_each_id_in_order(ids):
    events = [
        UsageEvent(
            id=i, time=datetime(2026, 1, 1, tzinfo=UTC), account_id=uuid.UUID(int=0), resource="ai_tokens", quantity=n, source="s"
        )
        for n, i in enumerate(ids)
    ]
    kept = metering.first_of_each_id(events)
    assert [e.id for e in kept] == list(dict.fromkeys(ids))
    assert all(e.quantity == ids.index(e.id) for e in kept)
    assert metering.first_of_each_id(kept) == kept


# ---- billing -------------------------------------------------------------------------------------
@given(st.sampled_from(Resource), st.integers(-(10**6), 2**70))
def test_a_package_price_is_exact_in_cents_and_fits_an_order_or_is_refused(resource, amount):
    prices = billing.package_prices()
    if resource not in prices:
        return
    unit = prices[resource]
    try:
        price = billing.package_amount(resource, amount, prices)
    except billing.BillingRuleError as exc:
        assert exc.code == "validation_error"
        return
    assert amount > 0 and amount % unit.unit == 0
    assert price == (unit.unit_price * amount / unit.unit).quantize(Decimal("0.01"))
    assert price < billing.MAX_ORDER_AMOUNT and price.as_tuple().exponent == -2


@given(st.sampled_from(Resource), st.integers(1, 10**6), st.integers(1, 10**6))
def test_more_of_a_package_never_costs_less(resource, a, b):
    prices = billing.package_prices()
    assume(resource in prices)
    unit = prices[resource].unit
    small, large = sorted((a * unit, b * unit))
    try:
        assert billing.package_amount(resource, small, prices) <= billing.package_amount(resource, large, prices)
    except billing.BillingRuleError:
        pytest.skip("beyond what one order holds")
