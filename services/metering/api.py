"""Metering's HTTP API: usage ingestion and usage analytics (API.md), scoped to the caller."""

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Literal
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Request, Response
from psycopg.rows import dict_row

from contracts.common import Permission, ServiceScope
from contracts.errors import ErrorCode
from contracts.events import UsageEvent
from contracts.metering_api import (
    ActivityItem,
    ActivityLog,
    ByProvider,
    ChangePct,
    IngestRequest,
    IngestResponse,
    ModelShare,
    Overview,
    PeriodTotals,
    ProviderItem,
    TimeRange,
    Trend,
    TrendPoint,
    TrendSeries,
)
from contracts.topics import USAGE
from contracts.usage_rules import violations
from services.edge.component import Runtime
from services.edge.errors import ApiError
from services.edge.principal import Principal
from services.edge.service_tokens import ServicePrincipal
from services.metering import csv_export, domain
from services.metering.domain import Granularity, GroupBy, InvalidQuery, RangeName
from services.metering.keymasks import KeyMasks
from services.metering.prices import PriceTable
from services.metering.store import ActivityFilter, MeteringStore, UsageQuery
from services.runtime.platform.kafka import within_publish_timeout

Clock = Callable[[], datetime]

RANGE_DOC = (
    "Ranges: `today`, `week` (ISO week, Monday first) and `month` are the whole calendar period containing now in `tz` "
    "(IANA; default the platform time zone), DST-correct; `custom` takes `start` and `end` (RFC 3339 with offset), "
    "widened to whole UTC hours (the rollup's resolution). The previous period is the calendar day/week/month before "
    "(for custom: the same duration ending at `start`). `change_pct` is null when the previous value is 0 and the "
    "current one is not. Costs are estimated at query time from the price table, as decimal strings with 6 places. "
    "`calls` counts usage events of `ai_tokens` (model calls); `total_tokens` of an event is input+output when it "
    "splits them, else its quantity. Zones with non-whole-hour offsets get buckets aligned to whole UTC hours. "
    "(v2) `previous` compares the same elapsed span: a period still running (this month so far) is compared with as "
    "many whole hours (the current one included) from the start of the previous period, never past its end; "
    "`previous.range` is the span compared. Models without a price have `estimated_cost: null` and `priced: false` "
    "(their tokens are counted, their cost is unknown, never 0); the overview's `estimated_cost` is that of the "
    "priced usage and `unpriced_tokens` says how much is not in it. `api_key_id=` keeps the usage reported with that "
    "key (usage events name it; a key of another account matches nothing)."
)
CSV_DOC = (
    " (v2) With `Accept: text/csv` the same rows are streamed as CSV (a header line first; an unpriced cost is an "
    "empty cell), written as they are read from the rollup."
)


def _invalid(exc: InvalidQuery) -> ApiError:
    return ApiError(422, ErrorCode.VALIDATION_ERROR, str(exc), details=[{"field": exc.field, "message": str(exc)}])


def _storable(field: str, value: datetime | None) -> None:
    """ClickHouse's DateTime64 holds the years 1900..2299; a bound outside would fail the query (a 500)."""
    if value is not None and not 1900 < value.year < 2299:
        raise _invalid(InvalidQuery(field, f"{field} must lie between the years 1901 and 2298"))


def _range_model(r: domain.TimeRange) -> TimeRange:
    return TimeRange(start=r.local(r.start), end=r.local(r.end))


def build_router(
    runtime: Runtime, store: MeteringStore, prices: PriceTable, masks: KeyMasks, clock: Clock | None = None
) -> APIRouter:
    settings = runtime.settings
    edge = runtime.edge
    now: Clock = clock or (lambda: datetime.now(UTC))
    router = APIRouter(tags=["metering"])
    usage_reader = edge.requires(Permission.USAGE_READ)
    usage_writer = edge.requires_service(ServiceScope.USAGE_WRITE)

    def query(principal: Principal, r: domain.TimeRange, api_key_id: UUID | None, per_key: bool = False) -> UsageQuery:
        return UsageQuery(principal.account_id, r.start, r.end, api_key_id, per_key)

    def resolve(name: RangeName, tz: str | None, start: datetime | None, end: datetime | None) -> domain.TimeRange:
        _storable("start", start)
        _storable("end", end)
        try:
            return domain.resolve_range(name, domain.zone(tz, settings.platform_timezone), now(), start, end)
        except InvalidQuery as exc:
            raise _invalid(exc) from None

    # ---- ingestion ---------------------------------------------------------------------------
    @router.post(
        "/api/usage/events",
        status_code=202,
        response_model=IngestResponse,
        summary="Report usage events (for platform services that do not speak Kafka)",
        description=(
            "Validated, idempotent on each event's `id`, and published to usage.v1 (key = account id) before the 202. "
            "A batch with any event that breaks a rule (contracts/usage_rules.py, the same the consumers of usage.v1 apply: "
            "a negative quantity on a flow resource, `ai_tokens` whose quantity is not input_tokens + output_tokens when "
            "both are given, a time more than 5 minutes ahead of or 35 days behind now, |quantity| above 10^12) is refused "
            'whole: 422 `validation_error`, one `details` item per broken rule, `{field: "events.<i>", index, message}`; '
            "nothing is published. "
            "**Service** endpoint: only a platform service token (`st-...`) with the scope `usage:write`, for any "
            "account; a customer's API key or console session gets 403 `permission_denied` (the metered party never "
            "writes its own meter), an unknown or revoked service token 401 `invalid_service_token`. "
            "`duplicates` counts events whose id this endpoint had already accepted "
            "(kept in Postgres `metering.ingested_events` for USAGE_IDEMPOTENCY_WINDOW_SECONDS, 7 days by default) or that "
            "repeat an id within the request; an id re-sent after the window is accepted and published again. The sink "
            "drops any duplicate that reaches Kafka (the same id, account and hour), through this endpoint or another way."
        ),
    )
    async def ingest(body: IngestRequest, _service: Annotated[ServicePrincipal, Depends(usage_writer)]) -> IngestResponse:
        reference = now()
        broken = [
            {"field": f"events.{i}", "index": i, "message": reason}
            for i, event in enumerate(body.events)
            for reason in violations(event, reference)
        ]
        if broken:  # the whole batch, or a retry could not tell what was counted
            raise ApiError(422, ErrorCode.VALIDATION_ERROR, "Some usage events break the contract's rules.", details=broken)
        unique = domain.first_of_each_id(body.events)
        ids = [e.id for e in unique]
        async with runtime.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute("SELECT id FROM metering.ingested_events WHERE id = ANY(%s)", [ids])
            known = {row["id"] for row in await cur.fetchall()}
        fresh = [e for e in unique if e.id not in known]
        topic = settings.topic(USAGE.name)
        # Unacknowledged within the timeout -> 503; the caller retries with the same ids (idempotent).
        await within_publish_timeout(asyncio.gather(*(_publish(runtime, topic, e) for e in fresh)))
        accepted = 0
        if fresh:
            async with runtime.pool.connection() as conn, conn.cursor() as cur:
                await cur.execute(
                    "INSERT INTO metering.ingested_events (id, account_id) SELECT * FROM unnest(%s::uuid[], %s::uuid[]) "
                    "ON CONFLICT (id) DO NOTHING RETURNING id",
                    [[e.id for e in fresh], [e.account_id for e in fresh]],
                )
                accepted = len(await cur.fetchall())
        return IngestResponse(accepted=accepted, duplicates=len(body.events) - accepted)

    # ---- analytics ---------------------------------------------------------------------------
    @router.get("/api/ai/usage/overview", response_model=Overview, description=RANGE_DOC)
    async def overview(
        principal: Annotated[Principal, Depends(usage_reader)],
        range: RangeName = "today",
        tz: str | None = None,
        start: datetime | None = None,
        end: datetime | None = None,
        api_key_id: UUID | None = None,
    ) -> Overview:
        r = resolve(range, tz, start, end)
        prev = domain.comparable_previous(r, now())
        # The previous period lies just before the current one: one read of the rollup for both.
        whole = UsageQuery(principal.account_id, prev.start, r.end, api_key_id)
        prev_rows, rows = await store.daily_rows_split(whole, prev.end, r.start)
        cur, before = domain.totals(rows, prices), domain.totals(prev_rows, prices)
        models = sorted(domain.by_model(rows, prices).items(), key=lambda kv: (-kv[1].total_tokens, kv[0]))
        days = domain.elapsed_days(r, now())
        return Overview(
            range=_range_model(r),
            input_tokens=cur.input_tokens,
            output_tokens=cur.output_tokens,
            total_tokens=cur.total_tokens,
            calls=cur.calls,
            estimated_cost=domain.money(cur.cost),
            currency=prices.currency,
            daily_average_tokens=domain.average(cur.total_tokens, days),
            previous=PeriodTotals(
                total_tokens=before.total_tokens,
                calls=before.calls,
                estimated_cost=domain.money(before.cost),
                unpriced_tokens=before.unpriced_tokens,
                range=_range_model(prev),
            ),
            change_pct=ChangePct(
                total_tokens=domain.change_pct(cur.total_tokens, before.total_tokens),
                calls=domain.change_pct(cur.calls, before.calls),
                estimated_cost=domain.change_pct(cur.cost, before.cost),
            ),
            models=[
                ModelShare(
                    provider=p,
                    model=m,
                    total_tokens=t.total_tokens,
                    share_pct=domain.pct(t.total_tokens, cur.total_tokens),
                    estimated_cost=t.estimated_cost,
                    priced=t.priced,
                )
                for (p, m), t in models
            ],
            unpriced_tokens=cur.unpriced_tokens,
        )

    @router.get(
        "/api/ai/usage/trend",
        response_model=Trend,
        responses=csv_export.CSV_RESPONSE,
        description=RANGE_DOC
        + " Every bucket of the range is present (zeros when empty); day and week buckets start at local midnight "
        "(weeks on Monday), so the first may start before the range. Without `group_by` there is one series, key "
        "`total`; with it one per model (keyed `provider/model`), provider or API key (keyed by the key id; `none` for "
        "usage reported without a key), or exactly the comma-separated `keys`. A point whose bucket holds usage of a "
        "model without a price has `estimated_cost: null`, `priced: false`. `as_of` is the newest event time included."
        + CSV_DOC
        + " CSV columns: key, t, input_tokens, output_tokens, total_tokens, calls, estimated_cost, priced.",
    )
    async def trend(
        request: Request,
        principal: Annotated[Principal, Depends(usage_reader)],
        range: RangeName = "today",
        tz: str | None = None,
        start: datetime | None = None,
        end: datetime | None = None,
        granularity: Granularity = "day",
        group_by: GroupBy | None = None,
        keys: str | None = None,
        api_key_id: UUID | None = None,
    ) -> Response:
        r = resolve(range, tz, start, end)
        wanted = [k.strip() for k in (keys or "").split(",") if k.strip()] or None
        if wanted and group_by is None:
            raise _invalid(InvalidQuery("keys", "keys needs group_by"))
        try:
            builder = domain.TrendBuilder(prices, r, granularity, group_by, wanted)  # rejects a too fine grid first
        except InvalidQuery as exc:
            raise _invalid(exc) from None
        local = {t: r.local(t) for t in builder.starts}  # once per bucket, not once per bucket and series
        csv = csv_export.wants_csv(request)
        blocks = store.stream_usage(query(principal, r, api_key_id), per="hour", group_by=group_by, keys=wanted, at_once=not csv)

        def points(series: list[domain.Series]) -> list[TrendSeries]:
            # Up to thousands of points: built without re-validating what the domain computed, and
            # serialised once by pydantic (validating and encoding them again through the response
            # model cost ~12 ms of a 30-day hourly trend's ~28).
            return [
                TrendSeries.model_construct(
                    key=key,
                    points=[
                        TrendPoint.model_construct(
                            t=local[t],
                            input_tokens=v.input_tokens,
                            output_tokens=v.output_tokens,
                            total_tokens=v.total_tokens,
                            calls=v.calls,
                            estimated_cost=v.estimated_cost,
                            priced=v.priced,
                        )
                        for t, v in cells
                    ],
                )
                for key, cells in series
            ]

        if csv:

            async def rows() -> AsyncIterator[list[Sequence[object]]]:
                async for block in blocks:
                    yield _trend_csv(points(builder.feed(block)))
                yield _trend_csv(points(builder.finish()))

            return csv_export.response(TREND_CSV, rows(), "usage-trend.csv")
        series: list[domain.Series] = []
        async for block in blocks:
            series += builder.feed(block)
        series += builder.finish()
        trend = Trend.model_construct(
            granularity=granularity,
            series=points(series),
            as_of=builder.as_of,
            range=_range_model(r),
            currency=prices.currency,
        )
        return Response(trend.model_dump_json(), media_type="application/json")

    @router.get(
        "/api/ai/usage/by-provider",
        response_model=ByProvider,
        responses=csv_export.CSV_RESPONSE,
        description=RANGE_DOC
        + " (v2) `group_by=api_key` gives one item per provider, model and key, with `api_key_id` (null for usage "
        "reported without a key) and `masked_key` (null for a key metering never saw)."
        + CSV_DOC
        + " CSV columns: provider, model, [api_key_id, masked_key with group_by=api_key,] calls, total_tokens, "
        "estimated_cost, priced; ordered by provider, model and key (JSON: by provider, then most tokens first).",
    )
    async def by_provider(
        request: Request,
        principal: Annotated[Principal, Depends(usage_reader)],
        range: RangeName = "today",
        tz: str | None = None,
        start: datetime | None = None,
        end: datetime | None = None,
        api_key_id: UUID | None = None,
        group_by: Literal["api_key"] | None = None,
    ) -> Response:
        r = resolve(range, tz, start, end)
        per_key = group_by == "api_key"
        csv = csv_export.wants_csv(request)
        blocks = store.stream_usage(query(principal, r, api_key_id, per_key), per="day", at_once=not csv)
        builder = domain.ItemBuilder(prices)

        def item(key: domain.ItemKey, t: domain.Totals) -> ProviderItem:
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
                masked_key=masks.get(key_id) if key_id is not None else None,
            )

        if csv:
            header = PROVIDER_CSV if per_key else [c for c in PROVIDER_CSV if c not in ("api_key_id", "masked_key")]

            def csv_rows(done: list[tuple[domain.ItemKey, domain.Totals]]) -> list[Sequence[object]]:
                return [[getattr(item(k, t), c) for c in header] for k, t in done]

            async def rows() -> AsyncIterator[list[Sequence[object]]]:
                async for block in blocks:
                    yield csv_rows(builder.feed(block))
                yield csv_rows(builder.finish())

            return csv_export.response(header, rows(), "usage-by-provider.csv")
        done: list[tuple[domain.ItemKey, domain.Totals]] = []
        async for block in blocks:
            done += builder.feed(block)
        done += builder.finish()
        done.sort(key=lambda kt: (kt[0][0], -kt[1].total_tokens, kt[0][1], str(kt[0][2])))
        body = ByProvider.model_construct(items=[item(k, t) for k, t in done], range=_range_model(r), currency=prices.currency)
        return Response(body.model_dump_json(), media_type="application/json")

    @router.get(
        "/api/activity-log",
        response_model=ActivityLog,
        description=(
            "The account's API-key calls, newest first. `start` (inclusive) and `end` (exclusive) bound the time; "
            "`limit` 1..200 (default 50); pass `next_cursor` back as `cursor` for the next page (keyset pagination: "
            "stable while new calls arrive). `masked_key` comes from keys.v1 and is null for a key metering never saw. "
            "Refused calls are logged too (401 for a disabled, expired or deleted key of the account, 403, 429) with "
            "their `error_code` (null on admitted calls); `count` > 1 when the edge folded refused calls of one key, "
            "code and second into one item under a flood. `status=` keeps one status; `outcome=admitted|refused`. "
            "(v2) With `Accept: text/csv`: every call the filters match (no limit, no cursor), newest first, streamed as "
            "CSV with the items' columns."
        ),
        responses=csv_export.CSV_RESPONSE,
    )
    async def activity_log(
        request: Request,
        principal: Annotated[Principal, Depends(edge.requires(Permission.ACTIVITY_READ))],
        start: datetime | None = None,
        end: datetime | None = None,
        api_key_id: UUID | None = None,
        ip: Annotated[str | None, Query(max_length=64)] = None,
        limit: Annotated[int, Query(ge=1, le=200)] = 50,
        cursor: Annotated[str | None, Query(max_length=200)] = None,
        status: Annotated[int | None, Query(ge=100, le=599)] = None,
        outcome: Literal["admitted", "refused"] | None = None,
    ) -> ActivityLog | Response:
        for field, value in (("start", start), ("end", end)):
            if value is not None and value.tzinfo is None:
                raise _invalid(InvalidQuery(field, f"{field} needs a UTC offset (RFC 3339)"))
            _storable(field, value)
        try:
            after = domain.Cursor.decode(cursor) if cursor else None
        except InvalidQuery as exc:
            raise _invalid(exc) from None
        refused = None if outcome is None else outcome == "refused"
        where = ActivityFilter(start=start, end=end, api_key_id=api_key_id, ip=ip, status=status, refused=refused)
        if csv_export.wants_csv(request):
            return activity_csv(store, masks, principal.account_id, where)
        rows = await store.calls(principal.account_id, where, limit + 1, after)
        page = rows[:limit]
        items = [
            ActivityItem(
                time=row.time,
                api_key_id=row.api_key_id,
                masked_key=masks.get(row.api_key_id),
                method=row.method,
                path=row.path,
                status=row.status,
                ip=row.ip,
                user_agent=row.user_agent,
                latency_ms=row.latency_ms,
                error_code=row.error_code,
                count=row.count,
            )
            for row in page
        ]
        next_cursor = domain.Cursor(page[-1].time, page[-1].id).encode() if len(rows) > limit else None
        return ActivityLog(items=items, next_cursor=next_cursor)

    return router


ACTIVITY_CSV = [
    "time",
    "api_key_id",
    "masked_key",
    "method",
    "path",
    "status",
    "ip",
    "user_agent",
    "latency_ms",
    "error_code",
    "count",
]


def activity_csv(store: MeteringStore, masks: KeyMasks, account_id: UUID, where: ActivityFilter) -> Response:
    """The activity log as CSV (`Accept: text/csv`): every call the filters match, newest first,
    streamed from the engine block by block (no page limit, no cursor)."""

    async def rows() -> AsyncIterator[list[Sequence[object]]]:
        async for block in store.stream_calls(account_id, where):
            yield [
                [
                    r.time.isoformat(),
                    r.api_key_id,
                    masks.get(r.api_key_id),
                    r.method,
                    r.path,
                    r.status,
                    r.ip,
                    r.user_agent,
                    r.latency_ms,
                    r.error_code,
                    r.count,
                ]
                for r in block
            ]

    return csv_export.response(ACTIVITY_CSV, rows(), "activity-log.csv")


TREND_CSV = ["key", "t", "input_tokens", "output_tokens", "total_tokens", "calls", "estimated_cost", "priced"]
PROVIDER_CSV = ["provider", "model", "api_key_id", "masked_key", "calls", "total_tokens", "estimated_cost", "priced"]


def _trend_csv(series: list[TrendSeries]) -> list[Sequence[object]]:
    return [
        [s.key, p.t.isoformat(), p.input_tokens, p.output_tokens, p.total_tokens, p.calls, p.estimated_cost, p.priced]
        for s in series
        for p in s.points
    ]


async def _publish(runtime: Runtime, topic: str, event: UsageEvent) -> None:
    await runtime.broker.publish(event, topic, key=str(event.account_id).encode())
