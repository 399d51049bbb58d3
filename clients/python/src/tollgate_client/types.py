"""The values the client hands back and takes: plain frozen dataclasses, parsed from Tollgate's JSON
(docs/api.md: "Protecting platform services (v3)", "Usage ingestion")."""

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4


def _uuid(value: Any) -> UUID | None:
    return None if value is None else UUID(str(value))


@dataclass(frozen=True)
class RateLimit:
    limit: int
    remaining: int
    reset: int  # seconds until the binding limit has room again


@dataclass(frozen=True)
class QuotaPosition:
    resource: str
    total: int
    used: int
    reserved: int
    remaining: int
    status: str  # "available" or "exhausted"


@dataclass(frozen=True)
class Verdict:
    """Tollgate's decision for one call: `valid`, or the status, code and error body that a route
    inside Tollgate would answer (so a refusal can be passed on to the caller as it is)."""

    valid: bool
    code: str
    status: int
    account_id: UUID | None = None
    api_key_id: UUID | None = None
    user_id: UUID | None = None
    role: str | None = None
    plan: str | None = None
    rate_limit: RateLimit | None = None
    retry_after: int | None = None
    quota: QuotaPosition | None = None
    error: dict[str, Any] | None = None  # the contract's error body: {"error": {"code", "message", ...}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Verdict":
        rate, quota = data.get("rate_limit"), data.get("quota")
        return cls(
            valid=bool(data["valid"]),
            code=str(data["code"]),
            status=int(data["status"]),
            account_id=_uuid(data.get("account_id")),
            api_key_id=_uuid(data.get("api_key_id")),
            user_id=_uuid(data.get("user_id")),
            role=data.get("role"),
            plan=data.get("plan"),
            rate_limit=RateLimit(int(rate["limit"]), int(rate["remaining"]), int(rate["reset"])) if rate else None,
            retry_after=data.get("retry_after"),
            quota=QuotaPosition(**quota) if quota else None,
            error=data.get("error"),
        )

    def headers(self) -> dict[str, str]:
        """The headers a protected route answers with this decision: the rate limit's state,
        `Retry-After` on a refusal that may be retried, `WWW-Authenticate` on a 401."""
        headers: dict[str, str] = {}
        if self.rate_limit is not None:
            headers["X-RateLimit-Limit"] = str(self.rate_limit.limit)
            headers["X-RateLimit-Remaining"] = str(self.rate_limit.remaining)
            headers["X-RateLimit-Reset"] = str(self.rate_limit.reset)
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        if self.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return headers


@dataclass(frozen=True)
class UsageEvent:
    """One usage event. Its `id` is made here, once: a retried report sends the same id, and
    Tollgate counts an id once (`duplicates` in the answer), so a retry never counts twice."""

    account_id: UUID
    resource: str
    quantity: int
    provider: str | None = None
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    source: str | None = None  # None: the client's `source`
    api_key_id: UUID | None = None
    reservation_id: UUID | None = None
    id: UUID = field(default_factory=uuid4)
    time: datetime = field(default_factory=lambda: datetime.now(UTC))

    def to_json(self, default_source: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": str(self.id),
            "time": self.time.isoformat(),
            "account_id": str(self.account_id),
            "resource": self.resource,
            "quantity": self.quantity,
            "source": self.source or default_source,
        }
        optional = {
            "provider": self.provider,
            "model": self.model,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "api_key_id": str(self.api_key_id) if self.api_key_id else None,
            "reservation_id": str(self.reservation_id) if self.reservation_id else None,
        }
        body.update({name: value for name, value in optional.items() if value is not None})
        return body


@dataclass(frozen=True)
class ReportResult:
    accepted: int  # new events, now in Kafka
    duplicates: int  # ids Tollgate already had (an earlier attempt whose answer was lost, a re-sent batch)


@dataclass
class Usage:
    """What a reservation settles with: the actual quantity and its details."""

    quantity: int
    provider: str | None = None
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    api_key_id: UUID | None = None
