"""Payloads of metering's HTTP API (API.md: Usage ingestion, Usage analytics). No I/O."""

from datetime import datetime
from typing import Literal
from uuid import UUID

from pydantic import BaseModel, Field

from contracts.events import UsageEvent
from contracts.key_limits import KeyLimitUsage

RangeName = Literal["today", "week", "month", "custom"]
Granularity = Literal["hour", "day", "week"]
GroupBy = Literal["model", "provider", "api_key"]


class ReportedUsage(UsageEvent):
    """A usage event as a platform service reports it over HTTP: with its `id`, which the event
    model would otherwise invent, a new one at every retry of the request (counted again)."""

    id: UUID = Field(description="The idempotency key: a retry of the same usage carries the same id.")


class IngestRequest(BaseModel):
    events: list[ReportedUsage] = Field(min_length=1, max_length=1000)


class IngestResponse(BaseModel):
    accepted: int = Field(description="events published to usage.v1 by this request")
    duplicates: int = Field(description="events whose id was already ingested (or repeated in this request)")


class TimeRange(BaseModel):
    start: datetime
    end: datetime


class PeriodTotals(BaseModel):
    total_tokens: int
    calls: int
    estimated_cost: str
    # (v2) tokens of models without a price (not in estimated_cost), and the span compared:
    # the previous period cut to as much of it as has elapsed of the current one.
    unpriced_tokens: int = 0
    range: TimeRange | None = None


class ChangePct(BaseModel):
    """Percent change against the previous period; null when the previous value is zero."""

    total_tokens: float | None
    calls: float | None
    estimated_cost: float | None


class ModelShare(BaseModel):
    provider: str
    model: str
    total_tokens: int
    share_pct: float
    estimated_cost: str | None = Field(description="(v2) null when the model has no price (priced: false)")
    priced: bool


class Overview(BaseModel):
    range: TimeRange
    input_tokens: int
    output_tokens: int
    total_tokens: int
    calls: int = Field(
        description="usage events of ai_tokens (model calls reported by the platform), not the api_calls quota "
        "(API-key calls the edge admitted)"
    )
    estimated_cost: str
    currency: str
    daily_average_tokens: float
    previous: PeriodTotals
    change_pct: ChangePct
    models: list[ModelShare]
    unpriced_tokens: int = Field(description="(v2) tokens of models without a price: not in estimated_cost")


class TrendPoint(BaseModel):
    t: datetime
    input_tokens: int
    output_tokens: int
    total_tokens: int
    calls: int
    estimated_cost: str | None = Field(description="null when the bucket holds usage of a model without a price")
    priced: bool


class TrendSeries(BaseModel):
    key: str
    points: list[TrendPoint]


class Trend(BaseModel):
    granularity: Granularity
    series: list[TrendSeries]
    as_of: datetime | None = Field(description="(v2) the newest event time included; null when none is")
    # Extensions (API.md is silent): the resolved range and the currency of estimated_cost.
    range: TimeRange
    currency: str


class ProviderItem(BaseModel):
    provider: str
    model: str
    calls: int
    total_tokens: int
    estimated_cost: str | None = Field(description="null when the model has no price (priced: false)")
    priced: bool
    # (v2) with group_by=api_key: the key (null for usage reported without one) and its mask
    api_key_id: UUID | None = None
    masked_key: str | None = None


class ByProvider(BaseModel):
    items: list[ProviderItem]
    # Extensions (API.md is silent): the resolved range and the currency of estimated_cost.
    range: TimeRange
    currency: str


class ActivityItem(BaseModel):
    time: datetime
    api_key_id: UUID
    masked_key: str | None
    method: str
    path: str
    status: int
    ip: str
    user_agent: str
    latency_ms: float
    # (v2) refused calls are logged too: the contract's code (null on an admitted call), and how
    # many refused calls of this key, code and second the edge folded into this item
    error_code: str | None = None
    count: int = 1
    # (v3) the platform service that verified the call (its service token's name); null on
    # Tollgate's own routes
    service: str | None = None
    # (v4) "usage": a usage event served on a model its key does not allow (still counted), told
    # in a call's terms so that v1 clients read it: method "USAGE", path "provider/model", status
    # 200, ip and user_agent "", latency_ms 0, error_code null; what it used in the fields below
    # (null on calls)
    kind: Literal["call", "usage"] = "call"
    model_not_allowed: bool = False
    provider: str | None = None
    model: str | None = None
    resource: str | None = None
    quantity: int | None = None


class ActivityLog(BaseModel):
    items: list[ActivityItem]
    next_cursor: str | None


class KeyLimitStanding(KeyLimitUsage):
    """(v4) A key's usage against one of its own limits in the window that holds now: `window`
    names it (`2026-11-26`, `2026-W48`, `2026-11`, `once`); `used` is what metering counted there."""

    window: str


class KeyUsageItem(BaseModel):
    api_key_id: UUID
    masked_key: str | None
    limits: list[KeyLimitStanding]


class ByKey(BaseModel):
    """(v4) `GET /api/ai/usage/by-key`: each live key of the account with its limits and its usage
    against each, as of `as_of`."""

    items: list[KeyUsageItem]
    as_of: datetime
