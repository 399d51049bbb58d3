"""Metering's vocabulary and domain errors, and the small rules of its own: an event counted
once per id, the activity log's cursor, the bounds a query may name. Pure: no I/O.

The bigger rules have their own modules: time ranges and buckets (ranges.py), sums, cost and
series of the rollup (rollups.py), the price table (prices.py).
"""

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Literal, TypeVar
from uuid import UUID
from zoneinfo import ZoneInfo

from contracts.domain_errors import Invalid
from contracts.events import CallEvent, UsageEvent
from contracts.key_limits import LimitPeriod, model_allowed, window_of
from contracts.period import period_bounds

RangeName = Literal["today", "week", "month", "custom"]
Granularity = Literal["hour", "day", "week"]
GroupBy = Literal["model", "provider", "api_key"]

UNKNOWN = "unknown"  # provider/model of a usage event that names none
NO_KEY = UUID(int=0)  # api_key_id stored for a usage event that names no key
NO_KEY_SERIES = "none"  # its trend series key with group_by=api_key
TOTAL_KEY = "total"  # the one series of a trend without group_by
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class InvalidQuery(Invalid):
    """A query answered with 422 validation_error; `field` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, details=[{"field": field, "message": message}])
        self.field = field


class UsageRulesBroken(Invalid):
    """A batch of usage events with any event that breaks contracts/usage_rules.py: refused whole
    (or a retry could not tell what was counted); one detail per broken rule."""

    def __init__(self, broken: list[dict[str, object]]) -> None:
        super().__init__("Some usage events break the contract's rules.", details=broken)


def storable(field: str, value: datetime | None) -> None:
    """ClickHouse's DateTime64 holds the years 1900..2299; a bound outside would fail the query (a 500)."""
    if value is not None and not 1900 < value.year < 2299:
        raise InvalidQuery(field, f"{field} must lie between the years 1901 and 2298")


def aware(field: str, value: datetime | None) -> None:
    """A bound without a UTC offset is ambiguous: refused, not guessed."""
    if value is not None and value.tzinfo is None:
        raise InvalidQuery(field, f"{field} needs a UTC offset (RFC 3339)")


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


# ---- (v4) usage of a model its key does not allow ---------------------------------------------
def model_not_allowed(allowed_models: Sequence[str], provider: str | None, model: str | None) -> bool:
    """Whether usage of `model` (by `provider`) is outside a key's `allowed_models`, judged as the
    edge judges a model (contracts.key_limits.model_allowed: `provider/model`, or the model's name
    alone when the event names no provider). Usage that names no model is of no model: never."""
    if model is None:
        return False
    return not model_allowed(allowed_models, model if provider is None else f"{provider}/{model}")


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


def limit_window(period: LimitPeriod, moment: datetime, tz: ZoneInfo) -> tuple[str, datetime, datetime | None]:
    """(v4) The window of a key's limit that holds at `moment` (contracts.key_limits.window_of):
    its name, its start (the epoch for `once`: all of the key's usage counts) and its end."""
    name, end = window_of(period, moment, tz)
    if period is LimitPeriod.DAY:
        day = date.fromisoformat(name)
    elif period is LimitPeriod.WEEK:
        year, week = name.split("-W")
        day = date.fromisocalendar(int(year), int(week), 1)
    elif period is LimitPeriod.MONTH:
        return name, period_bounds(name, tz)[0], end
    else:
        return name, EPOCH, end
    return name, datetime(day.year, day.month, day.day, tzinfo=tz), end
