"""Metering's time ranges and buckets in a time zone: the calendar periods a read names, the
period it is compared with, and the buckets of a trend. Pure: zoneinfo does the DST work.
"""

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from services.metering.domain import Granularity, InvalidQuery, RangeName

HOUR = timedelta(hours=1)
MAX_CUSTOM_SPAN = timedelta(days=400)
MAX_BUCKETS = 24 * 400


@dataclass(frozen=True, slots=True)
class TimeRange:
    """[start, end) in UTC, whole hours, with the zone its calendar was taken in."""

    start: datetime
    end: datetime
    tz: ZoneInfo
    name: RangeName

    def local(self, t: datetime) -> datetime:
        return t.astimezone(self.tz)


def zone(name: str | None, default: str) -> ZoneInfo:
    try:
        return ZoneInfo(name or default)
    except (ValueError, KeyError, OSError) as exc:  # unknown or malformed IANA name
        raise InvalidQuery("tz", f"unknown time zone {name!r}") from exc


def floor_hour(t: datetime) -> datetime:
    t = t.astimezone(UTC)
    return t.replace(minute=0, second=0, microsecond=0)


def ceil_hour(t: datetime) -> datetime:
    floored = floor_hour(t)
    return floored if floored == t.astimezone(UTC) else floored + HOUR


def local_midnight(day: date, tz: ZoneInfo) -> datetime:
    """The first instant of `day` in `tz`, in UTC (zoneinfo resolves DST gaps and folds)."""
    return datetime.combine(day, time(0), tzinfo=tz).astimezone(UTC)


def day_of_hour(hour: datetime, tz: ZoneInfo) -> date:
    """The local day a UTC hour of the rollup counts in: that of its last instant. In a zone whose
    offset is not whole hours (Asia/Kolkata, America/St_Johns) a day's first hour starts before
    its local midnight (23:30): it belongs to the day it mostly lies in, where its range puts it."""
    return (hour + HOUR - timedelta(microseconds=1)).astimezone(tz).date()


def day_start(day: date, tz: ZoneInfo) -> datetime:
    """Where `day` starts on the rollup's grid of whole UTC hours: its local midnight, floored."""
    return floor_hour(local_midnight(day, tz))


def _period_start(name: RangeName, day: date) -> date:
    if name == "today":
        return day
    if name == "week":
        return day - timedelta(days=day.weekday())  # ISO week: Monday
    return day.replace(day=1)


def _next_period(name: RangeName, start: date) -> date:
    if name == "today":
        return start + timedelta(days=1)
    if name == "week":
        return start + timedelta(days=7)
    return (start.replace(day=28) + timedelta(days=4)).replace(day=1)


def _previous_period(name: RangeName, start: date) -> date:
    if name == "today":
        return start - timedelta(days=1)
    if name == "week":
        return start - timedelta(days=7)
    return (start - timedelta(days=1)).replace(day=1)


def resolve_range(
    name: RangeName, tz: ZoneInfo, now: datetime, start: datetime | None = None, end: datetime | None = None
) -> TimeRange:
    """today/week/month: the whole calendar day, ISO week or month containing `now` in `tz`.
    custom: [start, end), widened to whole UTC hours (the rollup's resolution)."""
    if name == "custom":
        if start is None or end is None:
            raise InvalidQuery("start" if start is None else "end", "range=custom needs start and end")
        if start.tzinfo is None or end.tzinfo is None:
            raise InvalidQuery("start", "start and end need a UTC offset (RFC 3339)")
        lo, hi = floor_hour(start), ceil_hour(end)
        if hi <= lo:
            raise InvalidQuery("end", "end must be after start")
        if hi - lo > MAX_CUSTOM_SPAN:
            raise InvalidQuery("end", f"a custom range spans at most {MAX_CUSTOM_SPAN.days} days")
        return TimeRange(lo, hi, tz, name)
    if start is not None or end is not None:
        raise InvalidQuery("start", "start and end are only for range=custom")
    first = _period_start(name, now.astimezone(tz).date())
    return TimeRange(day_start(first, tz), day_start(_next_period(name, first), tz), tz, name)


def previous_range(r: TimeRange) -> TimeRange:
    """The period before `r` of equal length: the previous calendar day, ISO week or month for
    today/week/month; for custom, the same duration ending where `r` starts."""
    if r.name == "custom":
        return TimeRange(r.start - (r.end - r.start), r.start, r.tz, r.name)
    prev = _previous_period(r.name, day_of_hour(r.start, r.tz))
    return TimeRange(day_start(prev, r.tz), r.start, r.tz, r.name)


def comparable_previous(r: TimeRange, now: datetime) -> TimeRange:
    """The previous period cut to the span of `r` that has elapsed at `now` (whole hours, the
    current hour counted as it is in `r`'s sums): month so far vs as many hours of the month
    before, never past its end. A range already over compares whole periods; one not begun, none."""
    prev = previous_range(r)
    elapsed = min(max(ceil_hour(now) - r.start, timedelta(0)), r.end - r.start)
    return TimeRange(prev.start, min(prev.start + elapsed, prev.end), prev.tz, prev.name)


def elapsed_days(r: TimeRange, now: datetime) -> int:
    """Local calendar days of `r` up to now (a started day counts; future days do not); >= 1."""
    until = min(r.end, max(now, r.start))
    if until <= r.start:
        return 1
    first = day_of_hour(r.start, r.tz)
    last = r.local(until - timedelta(microseconds=1)).date()
    return max(1, (last - first).days + 1)


# ---- buckets -------------------------------------------------------------------------------
def bucket_of(hour: datetime, granularity: Granularity, tz: ZoneInfo) -> datetime:
    """The start (UTC) of the bucket holding the UTC hour `hour`: the hour itself, or the local
    midnight of its day, or the local Monday midnight of its ISO week (floored to a whole UTC
    hour: the grid of the rollup and of the range)."""
    if granularity == "hour":
        return hour
    day = day_of_hour(hour, tz)
    if granularity == "week":
        day -= timedelta(days=day.weekday())
    return day_start(day, tz)


def buckets(r: TimeRange, granularity: Granularity) -> list[datetime]:
    """Every bucket overlapping `r`, in order (UTC starts), so empty ones can be filled."""
    if granularity == "hour":
        count = int((r.end - r.start) / HOUR)
        if count > MAX_BUCKETS:
            raise InvalidQuery("granularity", f"at most {MAX_BUCKETS} buckets; choose a coarser granularity")
        return [r.start + i * HOUR for i in range(count)]
    first = day_of_hour(r.start, r.tz)
    last = day_of_hour(r.end - HOUR, r.tz)
    step = 1
    if granularity == "week":
        first -= timedelta(days=first.weekday())
        step = 7
    out = []
    day = first
    while day <= last:
        out.append(day_start(day, r.tz))
        day += timedelta(days=step)
    return out
