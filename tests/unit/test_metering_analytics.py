"""Metering's analytics use cases with a fake store and clock (services/metering/analytics.py):
overview, trend, by-provider and the activity log, JSON and streamed alike."""

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TypeVar

import pytest

from contracts.domain_errors import Invalid
from services.metering import prices
from services.metering.analytics import Analytics, Ask, TrendShape
from services.metering.domain import InvalidQuery
from services.metering.rollups import MAX_TREND_CELLS, MAX_TREND_KEYS
from services.metering.store import ActivityFilter, CallRow
from tests.unit.fakes import FakeClock, FakeMeteringStore

T = TypeVar("T")
ACCOUNT, OTHER = uuid.uuid4(), uuid.uuid4()
KEY, KEY2 = uuid.uuid4(), uuid.uuid4()
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
provider = "q"
model = "m"
input_per_1m = "10.00"
output_per_1m = "10.00"
effective_from = 2026-01-01
"""
)
NOW = datetime(2026, 11, 10, 12, 30, tzinfo=UTC)  # a Tuesday, mid-month


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def store() -> FakeMeteringStore:
    return FakeMeteringStore()


@pytest.fixture
def analytics(store: FakeMeteringStore, clock: FakeClock) -> Analytics:
    masks = {(ACCOUNT, KEY): "tg_live_ab...cdef"}
    return Analytics(store, TABLE, lambda account, key: masks.get((account, key)), clock, "UTC")


def custom(start: datetime, end: datetime, **extra: object) -> Ask:
    return Ask(ACCOUNT, "custom", "UTC", start, end, **extra)  # type: ignore[arg-type]


async def collect(blocks: AsyncIterator[list[T]]) -> list[T]:
    return [item async for block in blocks for item in block]


# ---- overview ----------------------------------------------------------------------------------------
async def test_overview_costs_the_priced_usage_and_counts_unpriced_tokens_apart(analytics: Analytics, store: FakeMeteringStore):
    store.add_usage(ACCOUNT, NOW - timedelta(hours=2), 1_000_000, 500_000)  # p/m: 1.00 + 1.00
    store.add_usage(ACCOUNT, NOW - timedelta(hours=1), 100_000, 0, provider="q")  # q/m: 1.00
    store.add_usage(ACCOUNT, NOW - timedelta(hours=1), 7_000, 3_000, provider="x", model="new")  # no price
    store.add_usage(OTHER, NOW, 9_999_999, 0)  # another account's: never counted
    o = await analytics.overview(Ask(ACCOUNT, "today"))
    assert (o.input_tokens, o.output_tokens, o.total_tokens, o.calls) == (1_107_000, 503_000, 1_610_000, 3)
    assert o.estimated_cost == "3.000000" and o.currency == "USD"
    assert o.unpriced_tokens == 10_000
    models = {(m.provider, m.model): m for m in o.models}
    assert list(models) == [("p", "m"), ("q", "m"), ("x", "new")]  # most tokens first
    assert models[("x", "new")].estimated_cost is None and models[("x", "new")].priced is False
    assert models[("p", "m")].estimated_cost == "2.000000" and models[("p", "m")].share_pct == 93.17
    assert o.range.start == datetime(2026, 11, 10, tzinfo=UTC) and o.daily_average_tokens == 1_610_000


async def test_overview_compares_the_same_elapsed_span_of_the_previous_period(analytics: Analytics, store: FakeMeteringStore):
    # Month so far: 1 Nov 00:00 .. 10 Nov 13:00 (the current hour counted). October's same span ends 10 Oct 13:00.
    store.add_usage(ACCOUNT, datetime(2026, 11, 3, 8, tzinfo=UTC), 300, 0)
    store.add_usage(ACCOUNT, datetime(2026, 10, 10, 12, 59, tzinfo=UTC), 100, 0)  # inside the span
    store.add_usage(ACCOUNT, datetime(2026, 10, 10, 13, tzinfo=UTC), 5_000, 0)  # after it: not compared
    store.add_usage(ACCOUNT, datetime(2026, 10, 25, tzinfo=UTC), 5_000, 0, provider="x")  # later in October
    o = await analytics.overview(Ask(ACCOUNT, "month"))
    assert o.previous.range.start == datetime(2026, 10, 1, tzinfo=UTC)
    assert o.previous.range.end == datetime(2026, 10, 10, 13, tzinfo=UTC)
    assert (o.previous.total_tokens, o.previous.calls, o.previous.unpriced_tokens) == (100, 1, 0)
    assert o.total_tokens == 300 and o.change_pct.total_tokens == 200.0 and o.change_pct.calls == 0.0
    assert o.daily_average_tokens == 30.0  # 10 days begun


async def test_overview_change_is_null_when_only_the_previous_value_is_zero(analytics: Analytics, store: FakeMeteringStore):
    store.add_usage(ACCOUNT, NOW, 10, 0)
    o = await analytics.overview(Ask(ACCOUNT, "today"))
    assert o.change_pct.total_tokens is None and o.previous.total_tokens == 0
    assert (await analytics.overview(Ask(OTHER, "today"))).change_pct.total_tokens == 0.0


async def test_overview_of_one_key(analytics: Analytics, store: FakeMeteringStore):
    store.add_usage(ACCOUNT, NOW, 10, 0, api_key_id=KEY)
    store.add_usage(ACCOUNT, NOW, 20, 0, api_key_id=KEY2)
    store.add_usage(ACCOUNT, NOW, 40, 0)
    assert (await analytics.overview(Ask(ACCOUNT, "today", api_key_id=KEY))).total_tokens == 10
    assert (await analytics.overview(Ask(ACCOUNT, "today"))).total_tokens == 70


async def test_bad_ranges_are_invalid_queries_naming_the_field(analytics: Analytics):
    cases = [
        (Ask(ACCOUNT, "custom", start=NOW), "end"),
        (custom(NOW, NOW - timedelta(hours=2)), "end"),
        (custom(datetime(1800, 1, 1, tzinfo=UTC), NOW), "start"),
        (Ask(ACCOUNT, "today", start=NOW), "start"),
        (Ask(ACCOUNT, "today", tz="Mars/Olympus"), "tz"),
    ]
    for ask, field in cases:
        with pytest.raises(InvalidQuery) as caught:
            await analytics.overview(ask)
        assert isinstance(caught.value, Invalid) and caught.value.details == [{"field": field, "message": caught.value.message}]


# ---- trend -------------------------------------------------------------------------------------------
async def test_trend_has_every_bucket_of_the_range_per_granularity(analytics: Analytics, store: FakeMeteringStore):
    store.add_usage(ACCOUNT, datetime(2026, 11, 2, 10, 15, tzinfo=UTC), 10, 5)
    store.add_usage(ACCOUNT, datetime(2026, 11, 2, 10, 45, tzinfo=UTC), 1, 0)
    store.add_usage(ACCOUNT, datetime(2026, 11, 9, 23, 59, tzinfo=UTC), 100, 0)
    ask = custom(datetime(2026, 11, 2, tzinfo=UTC), datetime(2026, 11, 10, tzinfo=UTC))
    hourly = await analytics.trend(ask, TrendShape("hour"))
    (series,) = hourly.series
    assert series.key == "total" and len(series.points) == 8 * 24
    assert [(p.t.hour, p.total_tokens, p.calls) for p in series.points if p.calls] == [(10, 16, 2), (23, 100, 1)]
    daily = (await analytics.trend(ask, TrendShape("day"))).series[0].points
    assert [p.t.day for p in daily] == list(range(2, 10)) and daily[0].total_tokens == 16 and daily[-1].total_tokens == 100
    weekly = (await analytics.trend(ask, TrendShape("week"))).series[0].points
    assert [(p.t.day, p.total_tokens) for p in weekly] == [(2, 16), (9, 100)]  # Monday midnights
    assert hourly.as_of == datetime(2026, 11, 9, 23, 59, tzinfo=UTC)  # the newest event included
    assert hourly.granularity == "hour" and hourly.currency == "USD"


async def test_trend_as_of_is_none_without_usage_and_a_range_past_400_days_is_refused(analytics: Analytics):
    ask = custom(datetime(2026, 11, 2, tzinfo=UTC), datetime(2026, 11, 3, tzinfo=UTC))
    assert (await analytics.trend(ask, TrendShape("hour"))).as_of is None
    long = custom(datetime(2025, 10, 1, tzinfo=UTC), datetime(2026, 11, 30, tzinfo=UTC))
    with pytest.raises(InvalidQuery, match="400 days") as caught:
        await analytics.trend(long, TrendShape("hour"))
    assert caught.value.field == "end"


async def test_trend_by_model_keeps_providers_apart_and_keys_pick_series(analytics: Analytics, store: FakeMeteringStore):
    for provider, tokens in (("p", 10), ("q", 20), ("p", 5)):
        store.add_usage(ACCOUNT, NOW - timedelta(hours=1), tokens, 0, provider=provider)
    store.add_usage(ACCOUNT, NOW, 1, 0, provider="x", model="new")
    today = Ask(ACCOUNT, "today")
    by_model = await analytics.trend(today, TrendShape("day", "model"))
    assert [(s.key, s.points[0].total_tokens, s.points[0].priced) for s in by_model.series] == [
        ("p/m", 15, True),
        ("q/m", 20, True),
        ("x/new", 1, False),
    ]
    assert by_model.series[2].points[0].estimated_cost is None
    picked = await analytics.trend(today, TrendShape("day", "model", ["q/m", "none/such", "p/m"]))
    assert [(s.key, s.points[0].total_tokens) for s in picked.series] == [("q/m", 20), ("none/such", 0), ("p/m", 15)]
    with pytest.raises(InvalidQuery) as caught:
        await analytics.trend(today, TrendShape("day", None, ["p/m"]))
    assert caught.value.field == "keys"


async def test_trend_by_api_key_names_usage_without_a_key_none(analytics: Analytics, store: FakeMeteringStore):
    store.add_usage(ACCOUNT, NOW, 10, 0, api_key_id=KEY)
    store.add_usage(ACCOUNT, NOW, 3, 0)
    trend = await analytics.trend(Ask(ACCOUNT, "today"), TrendShape("day", "api_key"))
    assert sorted((s.key, s.points[0].total_tokens) for s in trend.series) == sorted([(str(KEY), 10), ("none", 3)])


async def test_the_streamed_trend_is_the_same_series_judged_before_streaming(analytics: Analytics, store: FakeMeteringStore):
    for hour in range(6):  # more rows than one block of the fake
        store.add_usage(ACCOUNT, datetime(2026, 11, 10, hour, tzinfo=UTC), hour, 0, provider="pq"[hour % 2])
    shape = TrendShape("hour", "provider")
    whole = await analytics.trend(Ask(ACCOUNT, "today"), shape)
    streamed = await collect(analytics.trend_stream(Ask(ACCOUNT, "today"), shape))
    assert [s.model_dump() for s in streamed] == [s.model_dump() for s in whole.series]
    with pytest.raises(InvalidQuery):  # raised when asked, not when the response is half sent
        analytics.trend_stream(Ask(ACCOUNT, "today"), TrendShape("day", None, ["p"]))


# ---- by provider ---------------------------------------------------------------------------------------
async def test_by_provider_keeps_two_providers_models_of_one_name_apart(analytics: Analytics, store: FakeMeteringStore):
    store.add_usage(ACCOUNT, NOW, 1_000_000, 0, provider="p")
    store.add_usage(ACCOUNT, NOW - timedelta(hours=3), 100, 0, provider="q")
    store.add_usage(ACCOUNT, NOW, 400, 0, provider="q")
    store.add_usage(ACCOUNT, NOW, 50_000, 0, provider="q", model="new")
    body = await analytics.by_provider(Ask(ACCOUNT, "today"))
    assert [(i.provider, i.model, i.calls, i.total_tokens, i.estimated_cost, i.priced) for i in body.items] == [
        ("p", "m", 1, 1_000_000, "1.000000", True),
        ("q", "new", 1, 50_000, None, False),  # by provider, then most tokens first
        ("q", "m", 2, 500, "0.005000", True),
    ]
    assert all(i.api_key_id is None and i.masked_key is None for i in body.items)


async def test_by_provider_per_key_shows_the_masked_key(analytics: Analytics, store: FakeMeteringStore):
    store.add_usage(ACCOUNT, NOW, 10, 0, api_key_id=KEY)
    store.add_usage(ACCOUNT, NOW, 20, 0, api_key_id=KEY2)
    store.add_usage(ACCOUNT, NOW, 30, 0)
    items = (await analytics.by_provider(Ask(ACCOUNT, "today"), per_key=True)).items
    assert sorted((i.total_tokens, i.api_key_id, i.masked_key) for i in items) == [
        (10, KEY, "tg_live_ab...cdef"),
        (20, KEY2, None),  # a key metering never saw
        (30, None, None),  # usage reported without a key
    ]
    streamed = await collect(analytics.by_provider_stream(Ask(ACCOUNT, "today"), per_key=True))
    assert sorted(i.total_tokens for i in streamed) == [10, 20, 30]
    only = (await analytics.by_provider(Ask(ACCOUNT, "today", api_key_id=KEY2))).items
    assert [(i.total_tokens, i.api_key_id) for i in only] == [(20, None)]


async def test_another_accounts_key_named_in_usage_shows_no_mask(analytics: Analytics, store: FakeMeteringStore):
    """A platform service may report OTHER's usage naming ACCOUNT's key: OTHER sees the id it was
    sent, never ACCOUNT's mask."""
    store.add_usage(OTHER, NOW, 10, 0, api_key_id=KEY)
    items = (await analytics.by_provider(Ask(OTHER, "today"), per_key=True)).items
    assert [(i.api_key_id, i.masked_key) for i in items] == [(KEY, None)]


# ---- activity log ---------------------------------------------------------------------------------------
def call(seconds_ago: int, *, key: uuid.UUID = KEY, status: int = 200, error: str | None = None) -> CallRow:
    time = NOW - timedelta(seconds=seconds_ago)
    return CallRow(uuid.uuid4(), time, key, "GET", "/api/geo/projects", status, "10.0.0.1", "ua", 1.5, error)


@pytest.fixture
def calls(store: FakeMeteringStore) -> list[CallRow]:
    rows = [
        call(1),
        call(2, status=429, error="rate_limited"),
        call(3, key=KEY2),
        call(4, status=403, error="permission_denied"),
        call(5),
    ]
    for row in rows:
        store.add_call(ACCOUNT, row)
    store.add_call(OTHER, call(0))
    return rows


async def test_activity_pages_newest_first_with_a_cursor(analytics: Analytics, calls: list[CallRow]):
    first = await analytics.activity(ACCOUNT, ActivityFilter(), 2)
    assert [i.time for i in first.items] == [calls[0].time, calls[1].time] and first.next_cursor
    assert first.items[0].masked_key == "tg_live_ab...cdef" and first.items[1].error_code == "rate_limited"
    second = await analytics.activity(ACCOUNT, ActivityFilter(), 2, first.next_cursor)
    third = await analytics.activity(ACCOUNT, ActivityFilter(), 2, second.next_cursor)
    assert [i.time for i in second.items + third.items] == [c.time for c in calls[2:]]
    assert third.next_cursor is None


async def test_activity_filters_outcome_status_and_key(analytics: Analytics, calls: list[CallRow]):
    async def times(where: ActivityFilter) -> list[datetime]:
        return [i.time for i in (await analytics.activity(ACCOUNT, where, 50)).items]

    assert await times(ActivityFilter(refused=True)) == [calls[1].time, calls[3].time]
    assert await times(ActivityFilter(refused=False)) == [calls[0].time, calls[2].time, calls[4].time]
    assert await times(ActivityFilter(status=403)) == [calls[3].time]
    assert await times(ActivityFilter(api_key_id=KEY2)) == [calls[2].time]
    assert await times(ActivityFilter(start=calls[3].time, end=calls[1].time)) == [calls[2].time, calls[3].time]


async def test_activity_refuses_a_bad_cursor_and_bounds_without_an_offset(analytics: Analytics, calls: list[CallRow]):
    for where, cursor, field in (
        (ActivityFilter(), "not-a-cursor", "cursor"),
        (ActivityFilter(start=datetime(2026, 11, 1)), None, "start"),
        (ActivityFilter(end=datetime(2300, 1, 1, tzinfo=UTC)), None, "end"),
    ):
        with pytest.raises(InvalidQuery) as caught:
            await analytics.activity(ACCOUNT, where, 50, cursor)
        assert caught.value.field == field
    with pytest.raises(InvalidQuery):
        analytics.activity_stream(ACCOUNT, ActivityFilter(start=datetime(2026, 11, 1)))
    with pytest.raises(InvalidQuery):  # the export takes no cursor, but a broken one is still refused
        analytics.activity_stream(ACCOUNT, ActivityFilter(), "not-a-cursor")


async def test_the_streamed_activity_is_every_matching_call(analytics: Analytics, calls: list[CallRow]):
    items = await collect(analytics.activity_stream(ACCOUNT, ActivityFilter(refused=False)))
    assert [(i.time, i.masked_key) for i in items] == [
        (calls[0].time, "tg_live_ab...cdef"),
        (calls[2].time, None),
        (calls[4].time, "tg_live_ab...cdef"),
    ]
    assert Decimal(str(items[0].latency_ms)) == Decimal("1.5")


async def test_flagged_usage_is_an_activity_item_of_kind_usage_told_in_a_calls_terms(
    analytics: Analytics, store: FakeMeteringStore, calls: list[CallRow]
):
    """(v4) The store lists usage served on a model its key does not allow beside the calls."""
    time = NOW - timedelta(milliseconds=1500)
    usage = CallRow(
        uuid.uuid4(), time, KEY, "USAGE", "anthropic/claude-x", 200, "", "", 0.0,
        kind="usage", provider="anthropic", model="claude-x", resource="ai_tokens", quantity=120,
    )  # fmt: skip
    store.add_call(ACCOUNT, usage)
    page = await analytics.activity(ACCOUNT, ActivityFilter(), 50)
    assert [i.kind for i in page.items] == ["call", "usage", "call", "call", "call", "call"]
    item = page.items[1]
    assert item.model_not_allowed and item.masked_key == "tg_live_ab...cdef"
    assert (item.method, item.path, item.status, item.provider, item.model, item.quantity) == (
        "USAGE", "anthropic/claude-x", 200, "anthropic", "claude-x", 120,
    )  # fmt: skip
    assert not page.items[0].model_not_allowed and page.items[0].provider is None
    streamed = await collect(analytics.activity_stream(ACCOUNT, ActivityFilter(refused=False)))
    assert [i.kind for i in streamed] == ["call", "usage", "call", "call"] and streamed[1].model_not_allowed


async def test_a_trend_of_too_many_named_series_is_refused_before_anything_is_built(analytics: Analytics):
    """`keys=` names series the trend fills with a zero point per bucket even without usage: a
    short URL of a few hundred names, hourly over months, would otherwise build millions of points
    (gigabytes for one request of any reader, an API key included)."""
    many = [f"k{i}" for i in range(MAX_TREND_KEYS + 1)]
    today = Ask(ACCOUNT, "today")
    with pytest.raises(InvalidQuery) as caught:
        await analytics.trend(today, TrendShape("day", "model", many))
    assert caught.value.field == "keys"
    with pytest.raises(InvalidQuery):  # the CSV export too, refused before the first line
        analytics.trend_stream(today, TrendShape("day", "model", many))
    # a name repeated is one series
    assert len((await analytics.trend(today, TrendShape("day", "model", ["p/m"] * (MAX_TREND_KEYS + 1)))).series) == 1
    # few names, but each a series of every hour of 400 days: refused as well
    hour = NOW.replace(minute=0)
    year = custom(hour - timedelta(days=400), hour)
    hours = int(timedelta(days=400) / timedelta(hours=1))
    enough = [f"k{i}" for i in range(MAX_TREND_CELLS // hours + 1)]
    with pytest.raises(InvalidQuery) as caught:
        await analytics.trend(year, TrendShape("hour", "model", enough))
    assert caught.value.field == "keys"
    fine = await analytics.trend(year, TrendShape("day", "model", enough))  # by day it is small
    assert len(fine.series) == len(enough)


async def test_a_whole_trend_of_too_many_series_is_refused_and_its_csv_still_streams(
    analytics: Analytics, store: FakeMeteringStore
):
    """Without `keys=`, group_by answers a series per key (or model) that has usage in the range;
    an account can make as many keys as it likes and use each once, then ask for every hour of 400
    days per key: the JSON answer, built whole, would hold keys x 9600 points. It is refused past
    MAX_TREND_CELLS points; the CSV export, written one series at a time, still has them all."""
    hour = NOW.replace(minute=0)
    year = custom(hour - timedelta(days=400), hour)
    hours = int(timedelta(days=400) / timedelta(hours=1))
    keys = [uuid.uuid4() for _ in range(MAX_TREND_CELLS // hours + 1)]
    for key in keys:
        store.add_usage(ACCOUNT, NOW - timedelta(days=3), 1, 0, api_key_id=key)
    with pytest.raises(InvalidQuery) as caught:
        await analytics.trend(year, TrendShape("hour", "api_key"))
    assert caught.value.field == "group_by"
    streamed = await collect(analytics.trend_stream(year, TrendShape("hour", "api_key")))
    assert sorted(s.key for s in streamed) == sorted(str(k) for k in keys)
    by_day = await analytics.trend(year, TrendShape("day", "api_key"))  # the same series by day are few points
    assert len(by_day.series) == len(keys)
