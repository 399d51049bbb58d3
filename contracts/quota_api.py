"""Payloads of the quota endpoints (`GET /api/billing/check-quota`, `GET /api/ai/usage/quota`)."""

from typing import Literal
from urllib.parse import quote
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from contracts.common import Resource
from contracts.key_limits import LimitPeriod


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


# ---- (v2) the quota reads and insufficient_quota -----------------------------------------------
# The two quota reads: a blocked customer can always see why. The edge does not gate them on
# api_calls and the quota service does not count their calls.v1 events (method, route template).
UNCOUNTED_CALLS: frozenset[tuple[str, str]] = frozenset({("GET", "/api/billing/check-quota"), ("GET", "/api/ai/usage/quota")})


def counts_as_api_call(method: str, path: str, service: str | None = None) -> bool:
    """Whether an admitted API-key call on this route (template) counts against api_calls. Only
    Tollgate's own quota reads are free: a call a platform service verified (`service`, its
    token's name) is that service's, on its own route, whatever its path is named (a caller
    behind an ingress chooses it)."""
    return service is not None or (method, path) not in UNCOUNTED_CALLS


class QuotaLinks(BaseModel):
    """Console pages that lift a quota: the plan page and the package purchase of the resource."""

    upgrade_plan: str
    buy_quota_package: str


def quota_links(console_url: str, resource: Resource) -> QuotaLinks:
    """The one link format, in notifications, e-mails and insufficient_quota errors alike."""
    base = console_url.rstrip("/")
    return QuotaLinks(upgrade_plan=f"{base}/plan", buy_quota_package=f"{base}/quota?buy={quote(resource.value)}")


class InsufficientQuotaDetails(BaseModel):
    """`error.details` of every 403 insufficient_quota."""

    resource: Resource
    used: int
    total: int
    period_end: AwareDatetime | None = Field(
        description="End of the current period in the platform time zone; (v4) for a key's limit, when it resets "
        "(null for a `once` limit, which never does)."
    )
    links: QuotaLinks
    # (v4) whose limit refused: the key's own (`total` is the limit's amount) or the account's
    scope: Literal["account", "api_key"] = "account"
    limit_period: LimitPeriod | None = Field(default=None, description="(v4) The period of the key's limit that refused.")

    def body(self) -> dict[str, object]:
        """As `error.details` carries it: `limit_period` only on a key limit's refusal."""
        return self.model_dump(mode="json", exclude={"limit_period"} if self.limit_period is None else None)


class ReservationCreate(BaseModel):
    """(v2) `POST /api/quota/reservations`: hold `amount` of a resource before spending it."""

    model_config = ConfigDict(extra="forbid")

    account_id: UUID
    resource: Resource
    amount: int = Field(ge=1, le=10**12, description="What the service may spend (tokens, bytes, ...).")
    ttl_seconds: int = Field(ge=1, le=3600, description="Released at created + ttl unless settled or released before.")
    api_key_id: UUID | None = Field(
        default=None,
        description="(v4) The key whose call this is (verify's `api_key_id`): the reservation must also fit the key's "
        "own limits on the resource, and holds room in them until settled, released or expired.",
    )


class ReservationCreated(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: UUID
    expires_at: AwareDatetime
