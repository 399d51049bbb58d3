"""Metering's pure rules: ranges and buckets across DST, cost with effective dates, shares, cursor."""

import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.metering import domain, prices, ranges, rollups
from services.metering.domain import InvalidQuery
from services.metering.rollups import UsageRow

BERLIN = ZoneInfo("Europe/Berlin")
NY = ZoneInfo("America/New_York")
TABLE = prices.parse(
    """
currency = "USD"
[[prices]]
provider = "p"
model = "m"
input_per_1m = "1.00"
output_per_1m = "2.00"
effective_from = 2026-01-01
[[prices]]
provider = "p"
model = "m"
input_per_1m = "0.50"
output_per_1m = "1.00"
effective_from = 2026-03-01
"""
)


def test_today_in_a_zone_is_its_calendar_day_and_dst_days_have_23_or_25_hours():
    spring = ranges.resolve_range("today", BERLIN, datetime(2026, 3, 29, 12, tzinfo=UTC))
    assert spring.end - spring.start == timedelta(hours=23)
    assert spring.start == datetime(2026, 3, 28, 23, tzinfo=UTC)
    autumn = ranges.resolve_range("today", NY, datetime(2026, 11, 1, 12, tzinfo=UTC))
    assert autumn.end - autumn.start == timedelta(hours=25)
    assert len(ranges.buckets(autumn, "hour")) == 25
    assert ranges.buckets(autumn, "day") == [datetime(2026, 11, 1, 4, tzinfo=UTC)]


def test_week_and_month_and_their_previous_periods():
    now = datetime(2026, 3, 4, 10, tzinfo=UTC)  # a Wednesday
    week = ranges.resolve_range("week", BERLIN, now)
    assert week.local(week.start).date() == date(2026, 3, 2) and week.local(week.end).date() == date(2026, 3, 9)
    prev = ranges.previous_range(week)
    assert prev.local(prev.start).date() == date(2026, 2, 23) and prev.end == week.start
    month = ranges.resolve_range("month", BERLIN, now)
    prev = ranges.previous_range(month)
    assert prev.local(prev.start) == datetime(2026, 2, 1, tzinfo=BERLIN) and prev.end == month.start
    assert ranges.elapsed_days(month, now) == 4


def test_custom_ranges_widen_to_hours_and_reject_nonsense():
    r = ranges.resolve_range(
        "custom", UTC_ZONE, datetime.now(UTC), datetime(2026, 1, 1, 10, 30, tzinfo=UTC), datetime(2026, 1, 1, 11, 5, tzinfo=UTC)
    )
    assert (r.start.hour, r.end.hour) == (10, 12)
    assert ranges.previous_range(r).start == datetime(2026, 1, 1, 8, tzinfo=UTC)
    with pytest.raises(InvalidQuery):
        ranges.resolve_range("custom", UTC_ZONE, datetime.now(UTC), None, None)
    with pytest.raises(InvalidQuery):
        ranges.resolve_range(
            "custom", UTC_ZONE, datetime.now(UTC), datetime(2026, 1, 2, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC)
        )
    with pytest.raises(InvalidQuery):
        ranges.zone("Nowhere/Else", "UTC")


UTC_ZONE = ZoneInfo("UTC")


def test_week_buckets_start_on_local_monday_and_empty_buckets_are_filled():
    r = ranges.resolve_range(
        "custom", BERLIN, datetime.now(UTC), datetime(2026, 3, 25, tzinfo=BERLIN), datetime(2026, 4, 2, tzinfo=BERLIN)
    )
    starts = ranges.buckets(r, "week")
    assert [s.astimezone(BERLIN).date() for s in starts] == [date(2026, 3, 23), date(2026, 3, 30)]
    row = UsageRow(datetime(2026, 3, 30, 8, tzinfo=UTC), "p", "m", 1, 1000, 1000, 2000)
    grid = rollups.trend([row], TABLE, r, "week", None, None)
    assert [t.total_tokens for _, t in grid["total"]] == [0, 2000]
    keyed = rollups.trend([row], TABLE, r, "day", "model", ["p/m", "zzz"])  # (v2) model series are provider/model
    assert list(keyed) == ["p/m", "zzz"] and sum(t.calls for _, t in keyed["zzz"]) == 0
    assert sum(t.calls for _, t in keyed["p/m"]) == 1


def test_cost_uses_the_price_in_force_on_the_day_in_decimal():
    assert TABLE.cost("p", "m", date(2026, 2, 28), 1_000_000, 1_000_000) == Decimal("3.00")
    assert TABLE.cost("p", "m", date(2026, 3, 1), 1_000_000, 1_000_000) == Decimal("1.50")
    assert TABLE.cost("p", "m", date(2025, 12, 31), 10, 10) == 0
    assert TABLE.cost("x", "y", date(2026, 3, 1), 10, 10) == 0
    assert rollups.money(Decimal(3) / Decimal(1_000_000)) == "0.000003"
    assert prices.load().currency == "USD"  # the shipped table parses


def test_shares_changes_and_averages():
    assert rollups.change_pct(150, 100) == 50.0
    assert rollups.change_pct(0, 0) == 0.0
    assert rollups.change_pct(5, 0) is None
    assert rollups.pct(1, 3) == 33.33
    assert rollups.average(10, 3) == 3.33


def test_cursor_round_trips_and_rejects_garbage():
    c = domain.Cursor(datetime(2026, 1, 1, 0, 0, 0, 123000, tzinfo=UTC), uuid.uuid4())
    assert domain.Cursor.decode(c.encode()) == c
    with pytest.raises(InvalidQuery):
        domain.Cursor.decode("not-a-cursor")


@pytest.mark.parametrize("name", ["today", "week", "month", "custom"])
@pytest.mark.parametrize("tz", [BERLIN, NY, UTC_ZONE])
def test_the_previous_period_ends_where_the_current_starts(name, tz):
    """The overview reads both periods with one rollup query split at the current start."""
    now = datetime(2026, 3, 29, 1, 30, tzinfo=UTC)  # Berlin's spring-forward night
    span = (now - timedelta(days=3), now) if name == "custom" else (None, None)
    r = ranges.resolve_range(name, tz, now, *span)
    prev = ranges.previous_range(r)
    assert prev.end == r.start and prev.start < r.start


# ---- (v2) per key, honest numbers, streaming builders ---------------------------------------------
def test_model_series_keep_two_providers_models_of_one_name_apart_and_key_series_name_the_key():
    key = uuid.uuid4()
    a = UsageRow(datetime(2026, 3, 2, tzinfo=UTC), "p", "m", 1, 1, 1, 2, api_key_id=key)
    b = UsageRow(datetime(2026, 3, 2, tzinfo=UTC), "q", "m", 1, 1, 1, 2, api_key_id=domain.NO_KEY)
    assert (rollups.series_key(a, "model"), rollups.series_key(b, "model")) == ("p/m", "q/m")
    assert (rollups.series_key(a, "api_key"), rollups.series_key(b, "api_key")) == (str(key), "none")
    assert rollups.series_key(a, None) == "total" and rollups.series_key(a, "provider") == "p"


def test_unpriced_usage_has_no_cost_rather_than_zero():
    priced = UsageRow(datetime(2026, 3, 2, tzinfo=UTC), "p", "m", 2, 1_000_000, 0, 1_000_000)
    unpriced = UsageRow(datetime(2026, 3, 2, tzinfo=UTC), "x", "y", 3, 10, 20, 30)
    early = UsageRow(datetime(2025, 12, 31, tzinfo=UTC), "p", "m", 1, 5, 5, 10)  # before its first price
    t = rollups.totals([priced], TABLE)
    assert (t.priced, t.estimated_cost, t.unpriced_tokens) == (True, "0.500000", 0)
    t = rollups.totals([priced, unpriced, early], TABLE)
    assert (t.priced, t.estimated_cost, t.unpriced_tokens, t.unpriced_calls) == (False, None, 40, 4)
    assert t.cost == Decimal("0.5") and t.total_tokens == 1_000_040
    assert rollups.Totals().priced and rollups.Totals().estimated_cost == "0.000000"  # nothing used: costs 0


def test_the_previous_period_covers_the_same_elapsed_span():
    now = datetime(2026, 3, 10, 5, 30, tzinfo=UTC)
    month = ranges.resolve_range("month", UTC_ZONE, now)
    prev = ranges.comparable_previous(month, now)
    # 9 days and 6 hours (the running hour counts, as it does in the current sums)
    assert (prev.start, prev.end) == (datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 2, 10, 6, tzinfo=UTC))
    late = datetime(2026, 3, 31, 12, tzinfo=UTC)  # more elapsed than February has: its whole month
    prev = ranges.comparable_previous(ranges.resolve_range("month", UTC_ZONE, late), late)
    assert (prev.start, prev.end) == (datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC))
    past = ranges.resolve_range("custom", UTC_ZONE, now, datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 3, tzinfo=UTC))
    prev = ranges.comparable_previous(past, now)  # a range already over: the whole previous span
    assert (prev.start, prev.end) == (datetime(2025, 12, 30, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC))
    future = ranges.resolve_range("custom", UTC_ZONE, now, datetime(2026, 4, 1, tzinfo=UTC), datetime(2026, 4, 2, tzinfo=UTC))
    prev = ranges.comparable_previous(future, now)
    assert prev.start == prev.end  # nothing elapsed: nothing to compare


def test_the_trend_builder_emits_each_series_once_its_rows_are_read_and_tracks_as_of():
    r = ranges.resolve_range(
        "custom", UTC_ZONE, datetime.now(UTC), datetime(2026, 3, 2, tzinfo=UTC), datetime(2026, 3, 2, 3, tzinfo=UTC)
    )
    t1, t2 = datetime(2026, 3, 2, 0, 10, tzinfo=UTC), datetime(2026, 3, 2, 2, 59, tzinfo=UTC)
    rows = [
        UsageRow(datetime(2026, 3, 2, 0, tzinfo=UTC), "p", "m", 1, 1, 1, 2, last_time=t1),
        UsageRow(datetime(2026, 3, 2, 2, tzinfo=UTC), "x", "y", 1, 1, 1, 2, last_time=t2),
    ]
    builder = rollups.TrendBuilder(TABLE, r, "hour", "model", None)
    assert builder.feed(rows[:1]) == []  # p/m may continue in the next block
    done = builder.feed(rows[1:])
    assert [k for k, _ in done] == ["p/m"] and [c.calls for _, c in done[0][1]] == [1, 0, 0]
    last = builder.finish()
    assert [k for k, _ in last] == ["x/y"]
    assert [(c.priced, c.estimated_cost) for _, c in last[0][1]] == [(True, "0.000000"), (True, "0.000000"), (False, None)]
    assert builder.as_of == t2
    keyed = rollups.TrendBuilder(TABLE, r, "hour", "model", ["a/b", "x/y", "c/d"])
    out = keyed.feed(rows) + keyed.finish()  # p/m is not asked for; a/b and c/d are empty
    assert [k for k, _ in out] == ["a/b", "x/y", "c/d"] and keyed.as_of == t2
    empty = rollups.TrendBuilder(TABLE, r, "day", None, None)
    assert [k for k, _ in empty.finish()] == ["total"] and empty.as_of is None


def test_the_item_builder_sums_each_provider_model_and_key_across_days():
    key = uuid.uuid4()
    day1, day2 = datetime(2026, 2, 28, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC)
    rows = [
        UsageRow(day1, "p", "m", 1, 1_000_000, 0, 1_000_000, api_key_id=key),
        UsageRow(day2, "p", "m", 1, 1_000_000, 0, 1_000_000, api_key_id=key),  # the cheaper price from Mar 1
        UsageRow(day1, "p", "m", 1, 10, 0, 10, api_key_id=domain.NO_KEY),
    ]
    builder = rollups.ItemBuilder(TABLE)
    done = builder.feed(rows[:2])
    assert done == []
    done = builder.feed(rows[2:]) + builder.finish()
    assert [(k, t.calls, t.estimated_cost) for k, t in done] == [
        (("p", "m", key), 2, "1.500000"),
        (("p", "m", domain.NO_KEY), 1, "0.000010"),
    ]


@pytest.mark.parametrize("zone", ["Asia/Kolkata", "America/St_Johns", "Asia/Kathmandu", "Europe/Berlin"])
def test_a_zone_with_a_non_whole_hour_offset_keeps_its_day_whole_and_compares_with_the_day_before(zone):
    """A day's first rollup hour starts before its local midnight (23:30 in Kolkata): it is that
    day's, not an extra bucket of the day before; `previous` is yesterday, not the day before it;
    and today is one day of the daily average."""
    tz = ZoneInfo(zone)
    now = datetime(2026, 11, 26, 12, tzinfo=UTC)  # a Thursday in each zone
    today = ranges.resolve_range("today", tz, now)
    assert ranges.buckets(today, "day") == [today.start]
    assert ranges.bucket_of(today.start, "day", tz) == today.start  # its first hour is in its one bucket
    assert ranges.bucket_of(today.end - timedelta(hours=1), "day", tz) == today.start
    assert ranges.elapsed_days(today, now) == 1
    prev = ranges.previous_range(today)
    assert (prev.start, prev.end) == (today.start - timedelta(days=1), today.start)
    week = ranges.resolve_range("week", tz, now)
    assert ranges.buckets(week, "week") == [week.start] and len(ranges.buckets(week, "day")) == 7
    assert ranges.previous_range(week).start == week.start - timedelta(days=7)
    month = ranges.resolve_range("month", tz, now)
    assert len(ranges.buckets(month, "day")) == 30  # November
    assert ranges.buckets(month, "day")[0] == month.start


@given(
    st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "America/St_Johns", "Asia/Kathmandu",
                     "Australia/Lord_Howe", "Pacific/Chatham", "America/Havana"]),
    st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2040, 1, 1), timezones=st.just(UTC)),
    st.sampled_from(["today", "week", "month"]),
    st.sampled_from(["day", "week"]),
)  # fmt: skip
def test_every_hour_of_a_range_falls_in_one_of_its_buckets_and_the_first_holds_its_start(zone, now, name, granularity):
    tz = ZoneInfo(zone)
    r = ranges.resolve_range(name, tz, now)
    starts = ranges.buckets(r, granularity)
    assert starts == sorted(set(starts)) and starts[0] <= r.start
    hour = r.start
    while hour < r.end:
        assert ranges.bucket_of(hour, granularity, tz) in starts
        hour += timedelta(hours=1)
    if granularity == "day" or name == "week":  # a day's or a month's week may start before it
        assert starts[0] == r.start
    assert ranges.previous_range(r).end == r.start
