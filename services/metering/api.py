"""Metering's HTTP API: usage ingestion and usage analytics (API.md), scoped to the caller.

Thin: each route parses, calls one use case (services/metering/ingest.py, analytics.py) and
answers; a use case's domain error becomes the contract's error body in the edge.
"""

from datetime import datetime
from typing import Annotated, Literal
from uuid import UUID

import psycopg
from aiokafka.errors import KafkaError
from fastapi import APIRouter, Depends, Query, Request, Response
from prometheus_client import Counter

from contracts.common import Permission, ServiceScope
from contracts.metering_api import ActivityLog, ByKey, ByProvider, IngestRequest, IngestResponse, Overview, Trend
from services.edge import Principal, Runtime, ServicePrincipal
from services.metering import csv_export
from services.metering.analytics import Analytics, Ask, TrendShape
from services.metering.domain import Granularity, GroupBy, RangeName, UsageRulesBroken
from services.metering.ingest import Ingest
from services.metering.store import ActivityFilter

INGESTED = Counter(
    "tollgate_metering_ingest_events_total",
    "Usage events POST /api/usage/events took, by outcome: accepted (published) or duplicate (unit: events)",
    ["outcome"],
)
INGEST_REFUSED = Counter(
    "tollgate_metering_ingest_refused_events_total",
    "Usage events POST /api/usage/events refused, by reason: rules_broken (422) or unavailable (503) (unit: events)",
    ["reason"],
)
for _outcome in ("accepted", "duplicate"):  # on /metrics at 0 from the start
    INGESTED.labels(_outcome)
for _reason in ("rules_broken", "unavailable"):
    INGEST_REFUSED.labels(_reason)

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
CALLS_ARE_NOT_API_CALLS = (
    " `calls` (and `previous.calls`) are usage events of `ai_tokens`, i.e. model calls a platform service reported; "
    "they are not the `api_calls` quota of `GET /api/billing/check-quota`, which counts the API-key calls the edge "
    "admitted (every route but the two quota reads). A call to Tollgate with a key moves `api_calls` only; a model "
    "call reported as usage moves `calls` only."
)
CSV_DOC = (
    " (v2) With `Accept: text/csv` the same rows are streamed as CSV (a header line first; an unpriced cost is an "
    "empty cell), written as they are read from the rollup. A text cell that starts with `=`, `+`, `-`, `@`, a tab or "
    "a carriage return (a provider or model name a platform service reported) is prefixed with `'`, so that a "
    "spreadsheet shows it as text instead of running it as a formula (OWASP CSV injection)."
)


def build_router(runtime: Runtime, ingestion: Ingest, analytics: Analytics) -> APIRouter:
    edge = runtime.edge
    router = APIRouter(tags=["metering"])
    usage_reader = edge.requires(Permission.USAGE_READ)
    usage_writer = edge.requires_service(ServiceScope.USAGE_WRITE)

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
            "both are given, a time more than 5 minutes ahead of or 35 days behind now, |quantity|, input_tokens or "
            "output_tokens above 10^12) is refused "
            'whole: 422 `validation_error`, one `details` item per broken rule, `{field: "events.<i>", index, message}`; '
            "nothing is published. Every event carries its `id`, the idempotency key (a retry of the same usage sends the "
            "same id): one without it is 422 too (`details[].field` `events.<i>.id`), never given a new id. "
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
        try:
            result = await ingestion.accept(body.events)
        except UsageRulesBroken:
            INGEST_REFUSED.labels("rules_broken").inc(len(body.events))
            raise
        except (KafkaError, psycopg.OperationalError):
            INGEST_REFUSED.labels("unavailable").inc(len(body.events))
            raise
        INGESTED.labels("accepted").inc(result.accepted)
        INGESTED.labels("duplicate").inc(result.duplicates)
        return result

    # ---- analytics ---------------------------------------------------------------------------
    @router.get("/api/ai/usage/overview", response_model=Overview, description=RANGE_DOC + CALLS_ARE_NOT_API_CALLS)
    async def overview(
        principal: Annotated[Principal, Depends(usage_reader)],
        range: RangeName = "today",
        tz: str | None = None,
        start: datetime | None = None,
        end: datetime | None = None,
        api_key_id: UUID | None = None,
    ) -> Overview:
        return await analytics.overview(Ask(principal.account_id, range, tz, start, end, api_key_id))

    @router.get(
        "/api/ai/usage/trend",
        response_model=Trend,
        responses=csv_export.CSV_RESPONSE,
        description=RANGE_DOC
        + " Every bucket of the range is present (zeros when empty); day and week buckets start at local midnight "
        "(weeks on Monday), so the first may start before the range. Without `group_by` there is one series, key "
        "`total`; with it one per model (keyed `provider/model`), provider or API key (keyed by the key id; `none` for "
        "usage reported without a key), or exactly the comma-separated `keys` (at most 50, and at most 96000 points in all, "
        "keys x buckets: 422 `validation_error` otherwise). A JSON trend holds at most 96000 points (series x buckets): "
        "more is 422 `validation_error` on `group_by` (the CSV export has no such bound). A point whose bucket holds usage of a "
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
        ask = Ask(principal.account_id, range, tz, start, end, api_key_id)
        wanted = [k.strip() for k in (keys or "").split(",") if k.strip()] or None
        shape = TrendShape(granularity, group_by, wanted)
        if csv_export.wants_csv(request):
            return csv_export.response(
                csv_export.TREND, csv_export.trend_rows(analytics.trend_stream(ask, shape)), "usage-trend.csv"
            )
        trend = await analytics.trend(ask, shape)
        return Response(trend.model_dump_json(), media_type="application/json")

    @router.get(
        "/api/ai/usage/by-provider",
        response_model=ByProvider,
        responses=csv_export.CSV_RESPONSE,
        description=RANGE_DOC
        + " (v2) `group_by=api_key` gives one item per provider, model and key, with `api_key_id` (null for usage "
        "reported without a key) and `masked_key` (null for a key metering never saw)."
        + CSV_DOC
        + " CSV columns, those of the JSON items: provider, model, api_key_id, masked_key (empty without "
        "group_by=api_key, as they are null in the JSON), calls, total_tokens, estimated_cost, priced; ordered by "
        "provider, model and key (JSON: by provider, then most tokens first).",
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
        ask = Ask(principal.account_id, range, tz, start, end, api_key_id)
        per_key = group_by == "api_key"
        if csv_export.wants_csv(request):
            items = analytics.by_provider_stream(ask, per_key)
            return csv_export.response(csv_export.PROVIDER, csv_export.provider_rows(items), "usage-by-provider.csv")
        body = await analytics.by_provider(ask, per_key)
        return Response(body.model_dump_json(), media_type="application/json")

    @router.get(
        "/api/ai/usage/by-key",
        response_model=ByKey,
        responses=csv_export.CSV_RESPONSE,
        description="(v4) The by-key view: each live key of the account (`api_key_id=` keeps one; another account's "
        "key gives no item) with its own limits and its usage against each in the window that holds now: "
        "`{items: [{api_key_id, masked_key, limits: [{resource, period, window, used, amount, remaining, resets_at}]}], "
        "as_of}`. Windows start at 00:00 of the day, ISO week (Monday) or month in the platform time zone; `once` "
        "counts all of the key's usage and has `resets_at: null`. `used` is metering's count (usage events naming the "
        "key; for `api_calls` its admitted calls but the two quota reads); the edge enforces quota's own counter, which "
        "may be ahead of it by the sink's delay. With `Accept: text/csv`: one row per key and limit (a key without "
        "limits: one row with empty limit cells), columns " + ", ".join(csv_export.BY_KEY) + "; text cells that a "
        "spreadsheet would run as a formula are prefixed with `'`.",
    )
    async def by_key(
        request: Request,
        principal: Annotated[Principal, Depends(usage_reader)],
        api_key_id: UUID | None = None,
    ) -> Response:
        view = await analytics.by_key(principal.account_id, api_key_id)
        if csv_export.wants_csv(request):
            return csv_export.response(csv_export.BY_KEY, csv_export.by_key_rows(view), "usage-by-key.csv")
        return Response(view.model_dump_json(), media_type="application/json")

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
            "CSV with the items' columns. A text cell that starts with `=`, `+`, `-`, `@`, a tab or a carriage return "
            "(a caller's User-Agent or path) is prefixed with `'`, so that a spreadsheet shows it as text instead of "
            "running it as a formula (OWASP CSV injection). "
            "(v4) Usage served on a model its key does not allow (outside the key's `allowed_models` when the usage was "
            "written: later changes of the key do not judge past usage again) is listed too, in the same order and pages: "
            '`kind: "usage"`, `model_not_allowed: true`, its `provider`, `model`, `resource` and `quantity`, and in the '
            'call\'s fields method `USAGE`, path `provider/model`, status 200, ip and user_agent `""`, latency_ms 0. '
            'Calls have `kind: "call"`, `model_not_allowed: false` and those four fields null. `ip=`, a `status=` other '
            "than 200 and `outcome=refused` match no usage. The CSV has the six columns after the others."
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
        refused = None if outcome is None else outcome == "refused"
        where = ActivityFilter(start=start, end=end, api_key_id=api_key_id, ip=ip, status=status, refused=refused)
        if csv_export.wants_csv(request):
            items = analytics.activity_stream(principal.account_id, where, cursor)
            return csv_export.response(csv_export.ACTIVITY, csv_export.activity_rows(items), "activity-log.csv")
        return await analytics.activity(principal.account_id, where, limit, cursor)

    return router
