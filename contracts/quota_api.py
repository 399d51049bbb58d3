"""Payloads of the quota endpoints (`GET /api/billing/check-quota`, `GET /api/ai/usage/quota`)."""

from typing import Literal
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from contracts.common import Resource


class PeriodRange(BaseModel):
    """A quota period: [start, end) in the platform time zone, as RFC 3339 timestamps."""

    model_config = ConfigDict(frozen=True)

    start: AwareDatetime
    end: AwareDatetime


class QuotaItem(BaseModel):
    model_config = ConfigDict(frozen=True)

    resource: Resource
    total: int = Field(description="Plan quota plus the quota packages bought for this period.")
    used: int = Field(description="Flows: used this period. Stocks (geo_projects, storage_bytes): the current level.")
    remaining: int = Field(ge=0)
    usage_rate: float = Field(ge=0, description="used / total in percent, 2 decimals (100 when total is 0).")
    status: Literal["available", "exhausted"]
    band: Literal["green", "yellow", "red"] = Field(description="< 70 green, 70..90 yellow, > 90 red.")


class QuotaReport(BaseModel):
    period: PeriodRange
    items: list[QuotaItem]


class ReservationCreate(BaseModel):
    """(v2) `POST /api/quota/reservations`: hold `amount` of a resource before spending it."""

    model_config = ConfigDict(extra="forbid")

    account_id: UUID
    resource: Resource
    amount: int = Field(ge=1, le=10**12, description="What the service may spend (tokens, bytes, ...).")
    ttl_seconds: int = Field(ge=1, le=3600, description="Released at created + ttl unless settled or released before.")


class ReservationCreated(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: UUID
    expires_at: AwareDatetime
