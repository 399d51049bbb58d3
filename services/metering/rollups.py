"""Metering's rollups: hourly (or daily) sums of usage into totals, costs at the price of their
day, shares and changes, trend series and by-provider items. Pure: exact integer and Decimal
arithmetic over rows the store read.
"""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from uuid import UUID

from services.metering.domain import NO_KEY, NO_KEY_SERIES, TOTAL_KEY, Granularity, GroupBy, InvalidQuery
from services.metering.prices import PriceTable
from services.metering.ranges import MAX_BUCKETS, TimeRange, bucket_of, buckets

MONEY_QUANTUM = Decimal("0.000001")
# A trend's `keys=` name series that are answered even when empty (a zero point per bucket): a
# short URL must not make one request build millions of points.
MAX_TREND_KEYS = 50
MAX_TREND_CELLS = 10 * MAX_BUCKETS  # named series x buckets: 10 series hourly over the longest range


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
        self,
        prices: PriceTable,
        r: TimeRange,
        granularity: Granularity,
        group_by: GroupBy | None,
        keys: list[str] | None,
        *,
        whole: bool = False,
    ) -> None:
        self.prices, self.tz, self.granularity, self.group_by = prices, r.tz, granularity, group_by
        self.starts = buckets(r, granularity)
        # `whole`: every series is held until the answer is sent (JSON), so past MAX_TREND_CELLS
        # points it is refused; a stream (CSV) holds one series at a time and has no such bound.
        self.series_left = MAX_TREND_CELLS // max(1, len(self.starts)) if whole else None
        self.pending = list(dict.fromkeys(keys)) if keys else ([TOTAL_KEY] if group_by is None else [])
        if keys and len(self.pending) > MAX_TREND_KEYS:
            raise InvalidQuery("keys", f"at most {MAX_TREND_KEYS} keys")
        if keys and len(self.pending) * len(self.starts) > MAX_TREND_CELLS:
            raise InvalidQuery(
                "keys", f"at most {MAX_TREND_CELLS} points (keys x buckets); choose fewer keys or a coarser granularity"
            )
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

    def _count(self) -> None:
        """One more series made: refused past the bound of a whole answer, before it is built."""
        if self.series_left is None:
            return
        if self.series_left == 0:
            raise InvalidQuery(
                "group_by",
                f"more than {MAX_TREND_CELLS} points (series x buckets): pick series with keys=, choose a coarser "
                "granularity or a shorter range, or export the trend as CSV (Accept: text/csv)",
            )
        self.series_left -= 1

    def _close(self) -> Series:
        assert self.key is not None
        self._count()
        series = (self.key, [(s, self.cells.get(s) or Totals()) for s in self.starts])
        self.cells = {}
        return series

    def _empty_until(self, key: str | None) -> list[Series]:
        """The expected series before `key` (all of them at the end) that had no rows."""
        if key is not None and key not in self.pending:
            return []
        out: list[Series] = []
        while self.pending and self.pending[0] != key:
            self._count()
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
