"""(issue 38) `domain.event_period` is `period_of` exactly: its shortcut (no zone lookup from the
2nd to the 27th of a UTC month) answers what the zone's lookup does, for every zone."""

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo, available_timezones

from hypothesis import given
from hypothesis import strategies as st

from contracts.period import period_of
from services.quota.domain import event_period

ZONES = sorted(available_timezones())
# the widest offsets there are (Kiribati +14, Baker Island -12), and some with minutes
EDGE_ZONES = ["Pacific/Kiritimati", "Etc/GMT+12", "Asia/Kathmandu", "Australia/Eucla", "America/St_Johns", "Europe/Berlin"]


@given(
    st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)), st.sampled_from(ZONES)
)
def test_event_period_is_period_of_for_any_utc_instant_and_zone(moment, zone):
    assert event_period(moment, ZoneInfo(zone)) == period_of(moment, ZoneInfo(zone))


def test_event_period_is_period_of_around_every_month_end_and_the_shortcuts_bounds():
    for zone in map(ZoneInfo, EDGE_ZONES):
        for month in range(1, 13):
            start = datetime(2026 + month // 12, month % 12 + 1, 1, tzinfo=UTC)
            for day in (-2, -1, 0, 1, 2, 26, 27, 28):  # the last days of a month, the first, the shortcut's ends
                for moment in (start + timedelta(days=day, microseconds=d) for d in (-1, 0, 1)):
                    for hours in range(0, 24):
                        at = moment + timedelta(hours=hours)
                        assert event_period(at, zone) == period_of(at, zone), (at, zone)


def test_an_offset_other_than_utc_takes_the_zones_lookup():
    moment = datetime(2026, 11, 27, 23, 30, tzinfo=timezone(timedelta(hours=-23, minutes=-59)))  # Nov 28 23:29 UTC
    assert event_period(moment, ZoneInfo("Pacific/Kiritimati")) == period_of(moment, ZoneInfo("Pacific/Kiritimati")) == "2026-11"
