"""Analytics, metering's read side: the usage overview, trend and by-provider breakdown, and the
activity log, each of one account, from the store's rollup and call log.

The rules are pure (ranges.py: ranges and buckets; rollups.py: totals, cost, series); this
composes them over the store. A read that may be exported (trend, by-provider, activity) comes
whole (JSON) or as a stream of blocks (CSV, written as it is read: never held whole); either
way the request is judged first, so a bad one is refused before anything is streamed.
"""

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol
from uuid import UUID

from pydantic import TypeAdapter

from contracts.clock import Clock
from contracts.key_limits import LimitPeriod
from contracts.metering_api import (
    ActivityItem,
    ActivityLog,
    ByKey,
    ByProvider,
    ChangePct,
    KeyLimitStanding,
    KeyUsageItem,
    ModelShare,
    Overview,
    PeriodTotals,
    ProviderItem,
    TimeRange,
    Trend,
    TrendSeries,
)
from services.metering import domain, ranges, rollups
from services.metering.domain import Granularity, GroupBy, InvalidQuery, RangeName
from services.metering.keymasks import KnownKey
from services.metering.prices import PriceTable
from services.metering.rollups import UsageRow
from services.metering.store import ActivityFilter, CallRow, UsageQuery

MaskOf = Callable[[UUID, UUID], str | None]  # account, key id -> its masked key (keys.v1); None: never seen, or another account's
KeysOf = Callable[[UUID], list[KnownKey]]  # (v4) account id -> its live keys and their limits (keys.v1)


class UsageReads(Protocol):
    """What analytics reads (services/metering/store.py's MeteringStore; a fake in the unit tests)."""

    def stream_usage(
        self,
        q: UsageQuery,
        *,
        per: str,
        group_by: GroupBy | None = None,
        keys: list[str] | None = None,
        at_once: bool = False,
    ) -> AsyncIterator[list[UsageRow]]: ...

    async def daily_rows_split(
        self, q: UsageQuery, prev_end: datetime, split: datetime
    ) -> tuple[list[UsageRow], list[UsageRow]]: ...

    async def calls(self, account_id: UUID, where: ActivityFilter, limit: int, after: domain.Cursor | None) -> list[CallRow]: ...

    def stream_calls(self, account_id: UUID, where: ActivityFilter) -> AsyncIterator[list[CallRow]]: ...

    async def key_usage_since(
        self, account_id: UUID, key_ids: list[UUID], starts: list[datetime]
    ) -> dict[tuple[UUID, str, datetime], int]: ...


@dataclass(frozen=True, slots=True)
class Ask:
    """The usage a read is about: one account's, in a named or custom range, of one key or all."""

    account_id: UUID
    range: RangeName = "today"
    tz: str | None = None
    start: datetime | None = None
    end: datetime | None = None
    api_key_id: UUID | None = None


@dataclass(frozen=True, slots=True)
class TrendShape:
    granularity: Granularity = "day"
    group_by: GroupBy | None = None
    keys: list[str] | None = None  # exactly these series (needs group_by)


@dataclass(slots=True)
class _TrendPlan:
    r: ranges.TimeRange
    builder: rollups.TrendBuilder
    local: dict[datetime, datetime]
    blocks: AsyncIterator[list[UsageRow]]


def _range_model(r: ranges.TimeRange) -> TimeRange:
    return TimeRange(start=r.local(r.start), end=r.local(r.end))


class Analytics:
    def __init__(
        self, store: UsageReads, prices: PriceTable, masks: MaskOf, clock: Clock, default_tz: str, keys_of: KeysOf | None = None
    ) -> None:
        self.store = store
        self.keys_of: KeysOf = keys_of or (lambda _account: [])
        self.prices = prices
        self.masks = masks
        self.clock = clock
        self.default_tz = default_tz  # the platform time zone, for a read that names none

    def _resolve(self, ask: Ask, now: datetime) -> ranges.TimeRange:
        domain.storable("start", ask.start)
        domain.storable("end", ask.end)
        return ranges.resolve_range(ask.range, ranges.zone(ask.tz, self.default_tz), now, ask.start, ask.end)

    # ---- overview ----------------------------------------------------------------------------
    async def overview(self, ask: Ask) -> Overview:
        """Totals of the range, by model, and compared with the same elapsed span of the period before."""
        now = self.clock()
        r = self._resolve(ask, now)
        prev = ranges.comparable_previous(r, now)
        # The previous period lies just before the current one: one read of the rollup for both.
        whole = UsageQuery(ask.account_id, prev.start, r.end, ask.api_key_id)
        prev_rows, rows = await self.store.daily_rows_split(whole, prev.end, r.start)
        prices = self.prices
        cur, before = rollups.totals(rows, prices), rollups.totals(prev_rows, prices)
        models = sorted(rollups.by_model(rows, prices).items(), key=lambda kv: (-kv[1].total_tokens, kv[0]))
        days = ranges.elapsed_days(r, now)
        return Overview(
            range=_range_model(r),
            input_tokens=cur.input_tokens,
            output_tokens=cur.output_tokens,
            total_tokens=cur.total_tokens,
            calls=cur.calls,
            estimated_cost=rollups.money(cur.cost),
            currency=prices.currency,
            daily_average_tokens=rollups.average(cur.total_tokens, days),
            previous=PeriodTotals(
                total_tokens=before.total_tokens,
                calls=before.calls,
                estimated_cost=rollups.money(before.cost),
                unpriced_tokens=before.unpriced_tokens,
                range=_range_model(prev),
            ),
            change_pct=ChangePct(
                total_tokens=rollups.change_pct(cur.total_tokens, before.total_tokens),
                calls=rollups.change_pct(cur.calls, before.calls),
                estimated_cost=rollups.change_pct(cur.cost, before.cost),
            ),
            models=[
                ModelShare(
                    provider=p,
                    model=m,
                    total_tokens=t.total_tokens,
                    share_pct=rollups.pct(t.total_tokens, cur.total_tokens),
                    estimated_cost=t.estimated_cost,
                    priced=t.priced,
                )
                for (p, m), t in models
            ],
            unpriced_tokens=cur.unpriced_tokens,
        )

    # ---- trend -------------------------------------------------------------------------------
    def _trend_plan(self, ask: Ask, shape: TrendShape, *, at_once: bool) -> _TrendPlan:
        r = self._resolve(ask, self.clock())
        if shape.keys and shape.group_by is None:
            raise InvalidQuery("keys", "keys needs group_by")
        builder = rollups.TrendBuilder(  # a too fine grid first
            self.prices, r, shape.granularity, shape.group_by, shape.keys, whole=at_once
        )
        local = {t: r.local(t) for t in builder.starts}  # once per bucket, not once per bucket and series
        q = UsageQuery(ask.account_id, r.start, r.end, ask.api_key_id)
        blocks = self.store.stream_usage(q, per="hour", group_by=shape.group_by, keys=shape.keys, at_once=at_once)
        return _TrendPlan(r, builder, local, blocks)

    async def trend(self, ask: Ask, shape: TrendShape) -> Trend:
        """Every bucket of the range for each series (zeros where nothing happened)."""
        plan = self._trend_plan(ask, shape, at_once=True)
        series: list[rollups.Series] = []
        async for block in plan.blocks:
            series += plan.builder.feed(block)
        series += plan.builder.finish()
        return Trend.model_construct(
            granularity=shape.granularity,
            series=_points(series, plan.local),
            as_of=plan.builder.as_of,
            range=_range_model(plan.r),
            currency=self.prices.currency,
        )

    def trend_stream(self, ask: Ask, shape: TrendShape) -> AsyncIterator[list[TrendSeries]]:
        """The trend's series as soon as each is whole (judged now, read as iterated)."""
        plan = self._trend_plan(ask, shape, at_once=False)

        async def stream() -> AsyncIterator[list[TrendSeries]]:
            async for block in plan.blocks:
                yield _points(plan.builder.feed(block), plan.local)
            yield _points(plan.builder.finish(), plan.local)

        return stream()

    # ---- by provider -------------------------------------------------------------------------
    def _provider_blocks(
        self, ask: Ask, per_key: bool, *, at_once: bool
    ) -> tuple[ranges.TimeRange, AsyncIterator[list[UsageRow]]]:
        r = self._resolve(ask, self.clock())
        q = UsageQuery(ask.account_id, r.start, r.end, ask.api_key_id, per_key)
        return r, self.store.stream_usage(q, per="day", at_once=at_once)

    def _item(self, account_id: UUID, key: rollups.ItemKey, t: rollups.Totals) -> ProviderItem:
        provider, model, key_id = key
        key_id = None if key_id == domain.NO_KEY else key_id
        return ProviderItem.model_construct(
            provider=provider,
            model=model,
            calls=t.calls,
            total_tokens=t.total_tokens,
            estimated_cost=t.estimated_cost,
            priced=t.priced,
            api_key_id=key_id,
            masked_key=self.masks(account_id, key_id) if key_id is not None else None,
        )

    async def by_provider(self, ask: Ask, per_key: bool = False) -> ByProvider:
        """One item per provider and model (and key with `per_key`): by provider, most tokens first."""
        r, blocks = self._provider_blocks(ask, per_key, at_once=True)
        builder = rollups.ItemBuilder(self.prices)
        done: list[tuple[rollups.ItemKey, rollups.Totals]] = []
        async for block in blocks:
            done += builder.feed(block)
        done += builder.finish()
        done.sort(key=lambda kt: (kt[0][0], -kt[1].total_tokens, kt[0][1], str(kt[0][2])))
        return ByProvider.model_construct(
            items=[self._item(ask.account_id, k, t) for k, t in done], range=_range_model(r), currency=self.prices.currency
        )

    def by_provider_stream(self, ask: Ask, per_key: bool = False) -> AsyncIterator[list[ProviderItem]]:
        """The items ordered by provider, model and key, each as soon as its rows are read."""
        _, blocks = self._provider_blocks(ask, per_key, at_once=False)
        builder = rollups.ItemBuilder(self.prices)

        async def stream() -> AsyncIterator[list[ProviderItem]]:
            async for block in blocks:
                yield [self._item(ask.account_id, k, t) for k, t in builder.feed(block)]
            yield [self._item(ask.account_id, k, t) for k, t in builder.finish()]

        return stream()

    # ---- (v4) by key: each key's usage against its own limits -----------------------------------
    async def by_key(self, account_id: UUID, api_key_id: UUID | None = None) -> ByKey:
        """The account's live keys (or the one asked for; another account's key: no item), each with
        its limits and its lineage's usage (its own and that of the keys it was rotated from)
        counted in the window of each that holds now (platform time zone, as quota counts them).
        Metering's count is the analytics' view; quota's own counter is the one the edge enforces
        (the key's `usage` in GET /api/api-keys)."""
        now = self.clock()
        tz = ranges.zone(None, self.default_tz)
        keys = [k for k in self.keys_of(account_id) if api_key_id in (None, k.key_id)]
        keys.sort(key=lambda k: (k.masked_key or "", str(k.key_id)))
        windows = {p: domain.limit_window(p, now, tz) for p in LimitPeriod}
        wanted = {limit.period for k in keys for limit in k.limits}
        starts = sorted({windows[p][1] for p in wanted})
        # (v4) a key's limits count its whole lineage's usage (the keys it was rotated from too)
        lineage_keys = sorted({k for key in keys if key.limits for k in key.counted_keys})
        used = await self.store.key_usage_since(account_id, lineage_keys, starts)
        items = []
        for key in keys:
            limits = []
            for limit in key.limits:
                window, start, end = windows[limit.period]
                spent = sum(used.get((k, limit.resource.value, start), 0) for k in key.counted_keys)
                limits.append(
                    KeyLimitStanding(
                        resource=limit.resource,
                        period=limit.period,
                        window=window,
                        used=spent,
                        amount=limit.amount,
                        remaining=max(0, limit.amount - spent),
                        resets_at=end,
                    )
                )
            items.append(KeyUsageItem(api_key_id=key.key_id, masked_key=key.masked_key, limits=limits))
        return ByKey(items=items, as_of=now)

    # ---- activity log ------------------------------------------------------------------------
    async def activity(self, account_id: UUID, where: ActivityFilter, limit: int, cursor: str | None = None) -> ActivityLog:
        """The account's calls and (v4) the usage served on a model its key does not allow, newest
        first, a page of `limit` after `cursor`."""
        after = _judge(where, cursor)
        rows = await self.store.calls(account_id, where, limit + 1, after)
        page = rows[:limit]
        next_cursor = domain.Cursor(page[-1].time, page[-1].id).encode() if len(rows) > limit else None
        return ActivityLog(items=[self._activity_item(account_id, row, ActivityItem) for row in page], next_cursor=next_cursor)

    def activity_stream(
        self, account_id: UUID, where: ActivityFilter, cursor: str | None = None
    ) -> AsyncIterator[list[ActivityItem]]:
        """Every call the filters match, newest first, block by block (no page limit; a cursor is
        judged like the page's, and otherwise ignored)."""
        _judge(where, cursor)
        blocks = self.store.stream_calls(account_id, where)

        async def stream() -> AsyncIterator[list[ActivityItem]]:
            async for block in blocks:
                yield [self._activity_item(account_id, row, ActivityItem.model_construct) for row in block]

        return stream()

    def _activity_item(self, account_id: UUID, row: CallRow, make: Callable[..., ActivityItem]) -> ActivityItem:
        return make(
            time=row.time,
            api_key_id=row.api_key_id,
            masked_key=self.masks(account_id, row.api_key_id),
            method=row.method,
            path=row.path,
            status=row.status,
            ip=row.ip,
            user_agent=row.user_agent,
            latency_ms=row.latency_ms,
            error_code=row.error_code,
            count=row.count,
            service=row.service,
            kind=row.kind,
            model_not_allowed=row.kind == "usage",  # the only usage the log lists
            provider=row.provider,
            model=row.model,
            resource=row.resource,
            quantity=row.quantity,
        )


def _judge(where: ActivityFilter, cursor: str | None) -> domain.Cursor | None:
    """The activity log's bounds and cursor, or the field that is not valid."""
    for field, value in (("start", where.start), ("end", where.end)):
        domain.aware(field, value)
        domain.storable(field, value)
    return domain.Cursor.decode(cursor) if cursor else None


# Thousands of points: plain dicts validated in one pydantic-core call, 4 times faster than a
# model_construct per point (11.7 vs 2.8 ms for 1,440 points; BENCHMARKS.md, "metering at 100M").
_SERIES = TypeAdapter(list[TrendSeries])


def _points(series: list[rollups.Series], local: dict[datetime, datetime]) -> list[TrendSeries]:
    return _SERIES.validate_python(
        [
            {
                "key": key,
                "points": [
                    {
                        "t": local[t],
                        "input_tokens": v.input_tokens,
                        "output_tokens": v.output_tokens,
                        "total_tokens": v.total_tokens,
                        "calls": v.calls,
                        "estimated_cost": v.estimated_cost,
                        "priced": v.priced,
                    }
                    for t, v in cells
                ],
            }
            for key, cells in series
        ]
    )
