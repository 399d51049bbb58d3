"""(v4) The by-key view's use case on fakes: each key's limits with the usage of the window that
holds now, only the account's own keys, and the windows' bounds (pure)."""

import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from contracts.common import Resource
from contracts.key_limits import KeyLimit, LimitPeriod
from services.metering.analytics import Analytics
from services.metering.domain import EPOCH, limit_window
from services.metering.keymasks import KnownKey
from services.metering.prices import PriceTable
from tests.unit.fakes import FakeClock, FakeMeteringStore

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)  # Thursday, ISO week 48


@pytest.mark.parametrize(
    ("period", "window", "start", "end"),
    [
        (LimitPeriod.DAY, "2026-11-26", datetime(2026, 11, 26, tzinfo=UTC), datetime(2026, 11, 27, tzinfo=UTC)),
        (LimitPeriod.WEEK, "2026-W48", datetime(2026, 11, 23, tzinfo=UTC), datetime(2026, 11, 30, tzinfo=UTC)),
        (LimitPeriod.MONTH, "2026-11", datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)),
        (LimitPeriod.ONCE, "once", EPOCH, None),
    ],
)
def test_limit_window_bounds(period, window, start, end):
    assert limit_window(period, NOW, ZoneInfo("UTC")) == (window, start, end)


def test_a_window_starts_at_local_midnight():
    berlin = ZoneInfo("Europe/Berlin")
    _, start, _ = limit_window(LimitPeriod.DAY, datetime(2026, 11, 25, 23, 30, tzinfo=UTC), berlin)
    assert start == datetime(2026, 11, 26, tzinfo=berlin)


async def test_by_key_counts_each_limit_in_its_window_and_only_the_accounts_keys():
    account, other = uuid.uuid4(), uuid.uuid4()
    k1, k2, foreign = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    limits = (
        KeyLimit(resource=Resource.AI_TOKENS, amount=1000, period=LimitPeriod.DAY),
        KeyLimit(resource=Resource.AI_TOKENS, amount=5000, period=LimitPeriod.MONTH),
    )
    known = {
        account: [KnownKey(k2, account, "sk-bbbb...bbbb", ()), KnownKey(k1, account, "sk-aaaa...aaaa", limits)],
        other: [KnownKey(foreign, other, "sk-cccc...cccc", limits)],
    }
    store = FakeMeteringStore()
    store.add_usage(account, NOW - timedelta(hours=1), 600, 600, api_key_id=k1)  # today: over the daily limit
    store.add_usage(account, NOW - timedelta(days=3), 100, 0, api_key_id=k1)  # this month only
    store.add_usage(account, NOW - timedelta(hours=1), 9, 0, api_key_id=k2)
    store.add_usage(other, NOW - timedelta(hours=1), 77, 0, api_key_id=k1)  # another account naming k1
    analytics = Analytics(store, PriceTable("EUR", []), lambda _a, _k: None, FakeClock(NOW), "UTC", lambda a: known.get(a, []))

    view = await analytics.by_key(account)
    assert [(i.api_key_id, i.masked_key) for i in view.items] == [(k1, "sk-aaaa...aaaa"), (k2, "sk-bbbb...bbbb")]
    day, month = view.items[0].limits
    assert (day.window, day.used, day.amount, day.remaining, day.resets_at) == (
        "2026-11-26",
        1200,
        1000,
        0,
        datetime(2026, 11, 27, tzinfo=UTC),
    )
    assert (month.window, month.used, month.remaining) == ("2026-11", 1300, 3700)
    assert view.items[1].limits == [] and view.as_of == NOW
    assert (await analytics.by_key(account, foreign)).items == []  # another account's key: nothing
    assert [i.api_key_id for i in (await analytics.by_key(account, k2)).items] == [k2]


async def test_a_rotated_keys_limits_count_its_lineages_usage():
    """(v4) A key made by rotation goes on from its predecessor's usage: the row shows the
    lineage's (the deleted predecessor's included), never a sibling lineage's."""
    account = uuid.uuid4()
    first, second, current, unrelated = (uuid.uuid4() for _ in range(4))
    once = (KeyLimit(resource=Resource.AI_TOKENS, amount=500, period=LimitPeriod.ONCE),)
    known = {account: [KnownKey(current, account, "sk-dddd...dddd", once, lineage_keys=(first, second, current))]}
    store = FakeMeteringStore()
    for key, tokens in ((first, 300), (second, 150), (current, 20), (unrelated, 1000)):
        store.add_usage(account, NOW - timedelta(days=40), tokens, 0, api_key_id=key)
    analytics = Analytics(store, PriceTable("EUR", []), lambda _a, _k: None, FakeClock(NOW), "UTC", lambda a: known.get(a, []))
    [item] = (await analytics.by_key(account)).items
    [limit] = item.limits
    assert (item.api_key_id, limit.used, limit.remaining) == (current, 470, 30)
