"""Pure quota rules: periods, totals, usage rates, bands, blocks and threshold crossings.

The events counted are usage.v1's and calls.v1's as the consumers decode them: the contract's
model, or its msgspec mirror with the same values (contracts/fast_events.py, issue 38)."""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Literal
from uuid import UUID, uuid5
from zoneinfo import ZoneInfo

from contracts.common import Resource
from contracts.domain_errors import Forbidden
from contracts.errors import ErrorCode
from contracts.fast_events import Call, Usage
from contracts.key_limits import KeyLimit, LimitPeriod, window_of
from contracts.period import period_bounds, period_of
from contracts.quota_api import InsufficientQuotaDetails, counts_as_api_call, quota_links
from contracts.usage_rules import MAX_BEHIND

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_THRESHOLD_NS = UUID("6f1d3f0e-4a59-4f53-9a43-2f4a1f0c5b11")


# Refused calls (bad credentials, roles, quota, rate limit) used nothing, so they do not count
# against api_calls: (v2) the edge marks them with `error_code` (events of older edges by status).
REFUSED_STATUSES = frozenset({401, 403, 429})


Counted = Usage | Call


def call_counts(event: Call) -> bool:
    """Admitted calls count (refused ones carry an error code), except the quota reads (the edge
    does not gate them either)."""
    admitted = event.error_code is None and event.status not in REFUSED_STATUSES
    return admitted and counts_as_api_call(event.method, event.path, event.service)


@dataclass(frozen=True, slots=True)
class Delta:
    account_id: UUID
    resource: Resource
    period: str
    quantity: int
    last_time: datetime


def event_period(moment: datetime, tz: ZoneInfo) -> str:
    """`period_of`, without the zone's lookup where it cannot change the answer: a UTC instant from
    the 2nd to the 27th of its month is more than a day from both ends of it, and a UTC offset is
    under 24 hours (datetime enforces it), so every zone holds it in that same month."""
    if moment.tzinfo is UTC and 2 <= moment.day <= 27:
        return f"{moment.year:04d}-{moment.month:02d}"
    return period_of(moment, tz)


def deltas(events: Iterable[Counted], tz: ZoneInfo) -> list[Delta]:
    """Sum events per (account, resource, period of the event's own time), in arrival-independent form."""
    sums: dict[tuple[UUID, Resource, str], tuple[int, datetime]] = {}
    for event in events:
        if isinstance(event, Call):
            if not call_counts(event):
                continue
            resource, quantity = Resource.API_CALLS, 1
        else:
            resource, quantity = event.resource, event.quantity
        key = (event.account_id, resource, event_period(event.time, tz))
        qty, last = sums.get(key, (0, EPOCH))
        sums[key] = (qty + quantity, max(last, event.time))
    return [Delta(a, r, p, q, t) for (a, r, p), (q, t) in sums.items()]


def announces(period: str, now: datetime, tz: ZoneInfo) -> bool:
    """Whether crossings in `period` are still announced at `now`: while it runs, and for as long
    after its end as live usage may still be reported into it (the usage rules accept an event up
    to MAX_BEHIND before its record). Usage counted into an older period is history (a backfill
    of years): counted, but an alert about a month long over would only be noise."""
    return period_bounds(period, tz)[1] > now - MAX_BEHIND


def percent_floor(used: int, total: int) -> int:
    """Whole percent of the quota used, 0..100 (a zero quota is fully used)."""
    if total <= 0:
        return 100
    return max(0, min(100, used * 100 // total))


def usage_rate(used: int, total: int) -> Decimal:
    """Percent with 2 decimals (half up); may exceed 100 after an overshoot."""
    if total <= 0:
        return Decimal("100.00")
    return (Decimal(max(used, 0)) * 100 / Decimal(total)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


Band = Literal["green", "yellow", "red"]


def band(rate: Decimal) -> Band:
    if rate < 70:
        return "green"
    if rate <= 90:
        return "yellow"
    return "red"


def is_exhausted(used: int, total: int) -> bool:
    return used >= total


def is_blocked(used: int, reserved: int, total: int) -> bool:
    """quota.v1's `blocked` (v2): what is used plus what open reservations hold fills the total."""
    return used + reserved >= total


def fits(used: int, reserved: int, amount: int, total: int) -> bool:
    """Whether a reservation of `amount` may be made: used + reserved + amount <= total."""
    return used + reserved + amount <= total


class InsufficientQuota(Forbidden):
    """A reservation that does not fit: 403 insufficient_quota with the contract's details, plus
    what open reservations hold (why used < total can still refuse)."""

    def __init__(self, resource: Resource, used: int, reserved: int, total: int, period_end: datetime, console_url: str) -> None:
        details = InsufficientQuotaDetails(
            resource=resource, used=used, total=total, period_end=period_end, links=quota_links(console_url, resource)
        )
        super().__init__(
            f"The {resource.value} quota cannot hold a reservation of this size: used {used} + reserved "
            f"{reserved} of {total}; upgrade the plan or buy a quota package.",
            code=ErrorCode.INSUFFICIENT_QUOTA,
            details={**details.body(), "reserved": reserved},
        )
        self.resource = resource
        self.used = used
        self.reserved = reserved
        self.total = total
        self.period_end = period_end


def crossing(mark: int, used: int, total: int) -> int | None:
    """The highest whole percent newly crossed above `mark` (the last one announced), if any."""
    pct = percent_floor(used, total)
    return pct if pct > mark and pct >= 1 else None


def threshold_event_id(account_id: UUID, resource: Resource, period: str, pct: int) -> UUID:
    """Deterministic, so a crossing re-announced after a crash is the same event for alerts."""
    return uuid5(_THRESHOLD_NS, f"{account_id}:{resource.value}:{period}:{pct}")


# ---- (v4) limits per key ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class KeyDelta:
    """What a batch adds to one key lineage's counter in one window of one of its limits."""

    lineage_id: UUID
    resource: Resource
    period: LimitPeriod
    window: str
    quantity: int
    last_time: datetime


@dataclass(frozen=True, slots=True)
class KeyCharge:
    """What a key's events count against: its account, its lineage (keys.v1 KeyState.lineage: the
    counters its rotations share) and its own limits."""

    account_id: UUID
    lineage_id: UUID
    limits: list[KeyLimit]


def event_key(event: Counted) -> tuple[UUID, Resource, int] | None:
    """The key an event counts against, with its resource and quantity; None: no key, or nothing used."""
    if isinstance(event, Call):
        return (event.api_key_id, Resource.API_CALLS, 1) if call_counts(event) else None
    return None if event.api_key_id is None else (event.api_key_id, event.resource, event.quantity)


def key_deltas(events: Iterable[Counted], charges: Mapping[UUID, KeyCharge], tz: ZoneInfo) -> list[KeyDelta]:
    """Sum events per key lineage, limit and window of the event's own time. `charges`: key id ->
    what it counts against. An event counts only against a key of its own account (a platform
    service cannot charge another tenant's key) and only against the key's limits in force, in
    its lineage's counters: a rotated key goes on from where its predecessor stands."""
    sums: dict[tuple[UUID, Resource, LimitPeriod, str], tuple[int, datetime]] = {}
    for event in events:
        charged = event_key(event)
        if charged is None or charged[0] not in charges:
            continue
        key_id, resource, quantity = charged
        charge = charges[key_id]
        if charge.account_id != event.account_id:
            continue
        for limit in charge.limits:
            if limit.resource is not resource:
                continue
            window, _ = window_of(limit.period, event.time, tz)
            slot = (charge.lineage_id, resource, limit.period, window)
            qty, last = sums.get(slot, (0, EPOCH))
            sums[slot] = (qty + quantity, max(last, event.time))
    return [KeyDelta(k, r, p, w, q, t) for (k, r, p, w), (q, t) in sums.items()]


def lineage_limits(key_limits: Iterable[list[KeyLimit]]) -> list[KeyLimit]:
    """The limits a lineage's standings are published for: each (resource, period) that a live key
    of the lineage limits, with the narrowest amount when its keys differ (an old key PATCHed in
    its grace period). The edge judges each key by its own amount against the lineage's counts."""
    narrowest: dict[tuple[Resource, LimitPeriod], KeyLimit] = {}
    for limits in key_limits:
        for limit in limits:
            slot = (limit.resource, limit.period)
            if slot not in narrowest or limit.amount < narrowest[slot].amount:
                narrowest[slot] = limit
    return [narrowest[slot] for slot in sorted(narrowest)]


class KeyLimitExhausted(Forbidden):
    """A reservation that does not fit one of the key's own limits: 403 insufficient_quota with
    `details.scope: "api_key"`; `total` is the limit's amount and `period_end` when it resets
    (null for `once`, which never does)."""

    def __init__(self, limit: KeyLimit, used: int, reserved: int, resets_at: datetime | None, console_url: str) -> None:
        details = InsufficientQuotaDetails(
            resource=limit.resource,
            used=used,
            total=limit.amount,
            period_end=resets_at,
            links=quota_links(console_url, limit.resource),
            scope="api_key",
            limit_period=limit.period,
        )
        super().__init__(
            f"The key's own {limit.period.value} limit of {limit.resource.value} cannot hold a reservation of this "
            f"size: used {used} + reserved {reserved} of {limit.amount}.",
            code=ErrorCode.INSUFFICIENT_QUOTA,
            details={**details.body(), "reserved": reserved},
        )


def key_threshold_event_id(api_key_id: UUID, resource: Resource, period: LimitPeriod, window: str, pct: int) -> UUID:
    """Deterministic, as the account's: a re-announced crossing of a key's limit is the same event."""
    return uuid5(_THRESHOLD_NS, f"key:{api_key_id}:{resource.value}:{period.value}:{window}:{pct}")
