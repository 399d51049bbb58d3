"""Metering's pure rules: time ranges and buckets in a time zone, totals, cost, shares, change.

No I/O. Rows come in as hourly (or daily) sums from the rollup; everything here is exact
integer and Decimal arithmetic, with time-zone work done by zoneinfo (DST-correct).
"""

import base64
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Literal, TypeVar
from uuid import UUID
from zoneinfo import ZoneInfo

from contracts.events import CallEvent, UsageEvent
from services.metering.prices import PriceTable

RangeName = Literal["today", "week", "month", "custom"]
Granularity = Literal["hour", "day", "week"]
GroupBy = Literal["model", "provider", "api_key"]

HOUR = timedelta(hours=1)
MAX_CUSTOM_SPAN = timedelta(days=400)
MAX_BUCKETS = 24 * 400
MONEY_QUANTUM = Decimal("0.000001")
UNKNOWN = "unknown"  # provider/model of a usage event that names none
NO_KEY = UUID(int=0)  # api_key_id stored for a usage event that names no key
NO_KEY_SERIES = "none"  # its trend series key with group_by=api_key
TOTAL_KEY = "total"  # the one series of a trend without group_by
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class InvalidQuery(ValueError):
    """A query the API answers with 422 validation_error; `field` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


# ---- time ranges ---------------------------------------------------------------------------
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
    return TimeRange(floor_hour(local_midnight(first, tz)), floor_hour(local_midnight(_next_period(name, first), tz)), tz, name)


def previous_range(r: TimeRange) -> TimeRange:
    """The period before `r` of equal length: the previous calendar day, ISO week or month for
    today/week/month; for custom, the same duration ending where `r` starts."""
    if r.name == "custom":
        return TimeRange(r.start - (r.end - r.start), r.start, r.tz, r.name)
    first = r.local(r.start).date()
    prev = _previous_period(r.name, first)
    return TimeRange(floor_hour(local_midnight(prev, r.tz)), r.start, r.tz, r.name)


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
    first = r.local(r.start).date()
    last = r.local(until - timedelta(microseconds=1)).date()
    return max(1, (last - first).days + 1)


# ---- buckets -------------------------------------------------------------------------------
def bucket_of(hour: datetime, granularity: Granularity, tz: ZoneInfo) -> datetime:
    """The start (UTC) of the bucket holding the UTC hour `hour`: the hour itself, or the local
    midnight of its day, or the local Monday midnight of its ISO week."""
    if granularity == "hour":
        return hour
    day = hour.astimezone(tz).date()
    if granularity == "week":
        day -= timedelta(days=day.weekday())
    return local_midnight(day, tz)


def buckets(r: TimeRange, granularity: Granularity) -> list[datetime]:
    """Every bucket overlapping `r`, in order (UTC starts), so empty ones can be filled."""
    if granularity == "hour":
        count = int((r.end - r.start) / HOUR)
        if count > MAX_BUCKETS:
            raise InvalidQuery("granularity", f"at most {MAX_BUCKETS} buckets; choose a coarser granularity")
        return [r.start + i * HOUR for i in range(count)]
    first = r.local(r.start).date()
    last = r.local(r.end - timedelta(microseconds=1)).date()
    step = 1
    if granularity == "week":
        first -= timedelta(days=first.weekday())
        step = 7
    out = []
    day = first
    while day <= last:
        out.append(local_midnight(day, r.tz))
        day += timedelta(days=step)
    return out


# ---- sums, cost, shares ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class UsageRow:
    """Sums of one provider x model (x key) in one UTC hour (or UTC day: `start` at 00:00 UTC).
    `api_key_id` is None when the read was not per key; `last_time` is the newest event summed."""

    start: datetime
    provider: str
    model: str
    calls: int
    input_tokens: int
    output_tokens: int
    total_tokens: int
    api_key_id: UUID | None = None
    last_time: datetime | None = None


@dataclass(slots=True)
class Totals:
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    calls: int = 0
    cost: Decimal = Decimal(0)  # of the priced usage only
    unpriced_tokens: int = 0  # tokens of models without a price on their day
    unpriced_calls: int = 0

    def add(self, row: UsageRow, prices: PriceTable) -> None:
        self.input_tokens += row.input_tokens
        self.output_tokens += row.output_tokens
        self.total_tokens += row.total_tokens
        self.calls += row.calls
        day = row.start.astimezone(UTC).date()
        if prices.at(row.provider, row.model, day) is None:
            self.unpriced_tokens += row.total_tokens
            self.unpriced_calls += row.calls
        else:
            self.cost += prices.cost(row.provider, row.model, day, row.input_tokens, row.output_tokens)

    @property
    def priced(self) -> bool:
        """False when any usage summed here has no price: its cost is unknown, not 0."""
        return not self.unpriced_calls and not self.unpriced_tokens

    @property
    def estimated_cost(self) -> str | None:
        return money(self.cost) if self.priced else None


def money(amount: Decimal) -> str:
    """A decimal string with 6 places (token prices are fractions of a cent)."""
    return str(amount.quantize(MONEY_QUANTUM, rounding=ROUND_HALF_EVEN))


def pct(part: Decimal | int, whole: Decimal | int) -> float:
    if not whole:
        return 0.0
    return float((Decimal(part) * 100 / Decimal(whole)).quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN))


def average(total: int, days: int) -> float:
    """Per-day average, 2 decimals."""
    return float((Decimal(total) / Decimal(max(days, 1))).quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN))


def change_pct(current: Decimal | int, previous: Decimal | int) -> float | None:
    """Percent change; 0 when both are zero, None (undefined) when only the previous one is."""
    if not previous:
        return 0.0 if not current else None
    return pct(Decimal(current) - Decimal(previous), previous)


def totals(rows: Iterable[UsageRow], prices: PriceTable) -> Totals:
    out = Totals()
    for row in rows:
        out.add(row, prices)
    return out


def by_model(rows: Iterable[UsageRow], prices: PriceTable) -> dict[tuple[str, str], Totals]:
    out: dict[tuple[str, str], Totals] = defaultdict(Totals)
    for row in rows:
        out[(row.provider, row.model)].add(row, prices)
    return dict(out)


def series_key(row: UsageRow, group_by: GroupBy | None) -> str:
    """`provider/model` (two providers' models of one name stay apart), the provider, the key id
    (`none` for usage without a key), or `total`. store.series_sql is the same rule in SQL."""
    if group_by == "model":
        return f"{row.provider}/{row.model}"
    if group_by == "provider":
        return row.provider
    if group_by == "api_key":
        return NO_KEY_SERIES if row.api_key_id in (None, NO_KEY) else str(row.api_key_id)
    return TOTAL_KEY


Series = tuple[str, list[tuple[datetime, Totals]]]


class TrendBuilder:
    """Turns rollup rows ordered by series key into whole series (every bucket of the range,
    zeros where nothing happened), one series at a time: a CSV export writes each as soon as
    its rows are read, never holding more than one series. With `keys`, exactly those series
    in that order (even empty ones; rows must then come in that order); without `group_by`,
    the one series `total`. `as_of` is the newest event time fed in."""

    def __init__(
        self, prices: PriceTable, r: TimeRange, granularity: Granularity, group_by: GroupBy | None, keys: list[str] | None
    ) -> None:
        self.prices, self.tz, self.granularity, self.group_by = prices, r.tz, granularity, group_by
        self.starts = buckets(r, granularity)
        self.pending = list(dict.fromkeys(keys)) if keys else ([TOTAL_KEY] if group_by is None else [])
        self.only = set(keys) if keys else None
        self.key: str | None = None
        self.cells: dict[datetime, Totals] = {}
        self.as_of: datetime | None = None

    def feed(self, rows: Iterable[UsageRow]) -> list[Series]:
        done: list[Series] = []
        for row in rows:
            key = series_key(row, self.group_by)
            if self.only is not None and key not in self.only:
                continue
            if key != self.key:
                if self.key is not None:
                    done.append(self._close())
                done.extend(self._empty_until(key))
                self.key = key
            self.cells.setdefault(bucket_of(row.start, self.granularity, self.tz), Totals()).add(row, self.prices)
            if row.last_time is not None and (self.as_of is None or row.last_time > self.as_of):
                self.as_of = row.last_time
        return done

    def finish(self) -> list[Series]:
        done = [self._close()] if self.key is not None else []
        done.extend(self._empty_until(None))
        self.key = None
        return done

    def _close(self) -> Series:
        assert self.key is not None
        series = (self.key, [(s, self.cells.get(s) or Totals()) for s in self.starts])
        self.cells = {}
        return series

    def _empty_until(self, key: str | None) -> list[Series]:
        """The expected series before `key` (all of them at the end) that had no rows."""
        if key is not None and key not in self.pending:
            return []
        out: list[Series] = []
        while self.pending and self.pending[0] != key:
            out.append((self.pending.pop(0), [(s, Totals()) for s in self.starts]))
        if self.pending:
            self.pending.pop(0)
        return out


def trend(
    rows: Iterable[UsageRow],
    prices: PriceTable,
    r: TimeRange,
    granularity: Granularity,
    group_by: GroupBy | None,
    keys: list[str] | None,
) -> dict[str, list[tuple[datetime, Totals]]]:
    """key -> every bucket of `r` in order with its totals (zeros where nothing happened), from
    rows in any order. With `keys`, exactly those series (in that order), even when empty."""
    builder = TrendBuilder(prices, r, granularity, group_by, keys)
    rank = {k: i for i, k in enumerate(builder.pending)} if keys else None

    def order(row: UsageRow) -> tuple[int, str]:
        key = series_key(row, group_by)
        return (rank.get(key, -1), "") if rank is not None else (0, key)

    return dict(builder.feed(sorted(rows, key=order)) + builder.finish())


ItemKey = tuple[str, str, UUID | None]  # provider, model, api key (None when not per key)


class ItemBuilder:
    """Turns rollup rows ordered by (provider, model, key) into by-provider items, each emitted
    as soon as its rows are all read (a CSV export holds one item at a time)."""

    def __init__(self, prices: PriceTable) -> None:
        self.prices = prices
        self.key: ItemKey | None = None
        self.totals = Totals()

    def feed(self, rows: Iterable[UsageRow]) -> list[tuple[ItemKey, Totals]]:
        done: list[tuple[ItemKey, Totals]] = []
        for row in rows:
            key = (row.provider, row.model, row.api_key_id)
            if key != self.key:
                if self.key is not None:
                    done.append((self.key, self.totals))
                self.key, self.totals = key, Totals()
            self.totals.add(row, self.prices)
        return done

    def finish(self) -> list[tuple[ItemKey, Totals]]:
        done = [(self.key, self.totals)] if self.key is not None else []
        self.key, self.totals = None, Totals()
        return done


# ---- events ----------------------------------------------------------------------------------
E = TypeVar("E", UsageEvent, CallEvent)


def first_of_each_id(events: list[E]) -> list[E]:
    seen: set[UUID] = set()
    out: list[E] = []
    for e in events:
        if e.id not in seen:
            seen.add(e.id)
            out.append(e)
    return out


# ---- activity-log cursor ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Cursor:
    """Keyset position: the (time, id) of the last item returned (items go newest first)."""

    time: datetime
    id: UUID

    def encode(self) -> str:
        micros = (self.time - EPOCH) // timedelta(microseconds=1)
        return base64.urlsafe_b64encode(f"{micros}:{self.id}".encode()).decode().rstrip("=")

    @staticmethod
    def decode(token: str) -> "Cursor":
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
            micros, _, ident = raw.partition(":")
            cursor = Cursor(EPOCH + timedelta(microseconds=int(micros)), UUID(ident))
        except (ValueError, UnicodeDecodeError, OverflowError) as exc:  # a huge number overflows the date
            raise InvalidQuery("cursor", "the cursor is not valid") from exc
        if not 1900 < cursor.time.year < 2299:  # outside ClickHouse's DateTime64: the query would fail
            raise InvalidQuery("cursor", "the cursor is not valid")
        return cursor
