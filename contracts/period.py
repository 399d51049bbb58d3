"""The billing and quota period: a calendar month in the platform's time zone, named `YYYY-MM`."""

from datetime import datetime
from zoneinfo import ZoneInfo


def period_of(moment: datetime, tz: ZoneInfo) -> str:
    """`YYYY-MM`: the calendar month in the platform zone that `moment` falls in."""
    local = moment.astimezone(tz)
    return f"{local.year:04d}-{local.month:02d}"


def period_bounds(period: str, tz: ZoneInfo) -> tuple[datetime, datetime]:
    """[start, end) of a period: day 1 00:00 local time of the month and of the next month."""
    year, month = (int(p) for p in period.split("-"))
    start = datetime(year, month, 1, tzinfo=tz)
    end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=tz)
    return start, end


def bounds_of(moment: datetime, tz: ZoneInfo) -> tuple[str, datetime, datetime]:
    """The period `moment` falls in, with its [start, end)."""
    period = period_of(moment, tz)
    return (period, *period_bounds(period, tz))
