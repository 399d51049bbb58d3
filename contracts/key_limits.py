"""(v4) What makes one API key narrower than its account (API.md, "Per-key limits and
restrictions"): limits per resource and period, the models, routes and addresses it may use, and
a rate limit of its own. keys owns them (keys.v1), quota counts the limits, the edge enforces all.
"""

import ipaddress
from collections.abc import Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Annotated
from zoneinfo import ZoneInfo

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from contracts.common import Resource
from contracts.period import period_bounds, period_of
from contracts.rate_limit import RateLimit

MAX_LIST = 100  # entries per list: a key's rules are read on every call


class LimitPeriod(StrEnum):
    DAY = "day"
    WEEK = "week"  # ISO week, Monday 00:00
    MONTH = "month"
    ONCE = "once"  # credits that never refill (a trial)


class KeyLimit(BaseModel):
    model_config = ConfigDict(frozen=True)

    resource: Resource
    amount: int = Field(gt=0, le=2**63 - 1)
    period: LimitPeriod


def _model_pattern(value: str) -> str:
    provider, sep, model = value.partition("/")
    if not sep or not provider or not model or "*" in provider or ("*" in model and model != "*"):
        raise ValueError("a model pattern is `provider/model` or `provider/*`")
    return value


def _route_pattern(value: str) -> str:
    method, sep, path = value.partition(" ")
    if not sep or not method.isascii() or not method.isupper() or not method.isalpha() or len(method) > 16:
        raise ValueError("a route pattern is `METHOD /path` or `METHOD /prefix/*`")
    if not path.startswith("/") or not all(0x21 <= ord(c) <= 0x7E for c in path):
        raise ValueError("a route's path starts with / and is printable ASCII without spaces")
    if "*" in path[:-1]:
        raise ValueError("`*` may only end a route pattern")
    return value


def _cidr(value: str) -> str:
    # An address alone is its own /32 or /128; host bits are kept as written would be a typo trap,
    # so the network is written back in its canonical form.
    return ipaddress.ip_network(value.strip(), strict=False).with_prefixlen


ModelPattern = Annotated[str, Field(max_length=200), AfterValidator(_model_pattern)]
RoutePattern = Annotated[str, Field(max_length=530), AfterValidator(_route_pattern)]
Cidr = Annotated[str, Field(max_length=64), AfterValidator(_cidr)]


def one_per_resource_and_period(limits: list[KeyLimit]) -> list[KeyLimit]:
    seen = [(limit.resource, limit.period) for limit in limits]
    if len(seen) != len(set(seen)):
        raise ValueError("one limit per resource and period")
    return limits


class KeyRules(BaseModel):
    """Everything that narrows a key. An empty list allows everything; `rate_limit` None = the plan's."""

    model_config = ConfigDict(frozen=True)

    limits: list[KeyLimit] = Field(default_factory=list, max_length=len(Resource) * len(LimitPeriod))
    allowed_models: list[ModelPattern] = Field(default_factory=list, max_length=MAX_LIST)
    allowed_routes: list[RoutePattern] = Field(default_factory=list, max_length=MAX_LIST)
    allowed_ips: list[Cidr] = Field(default_factory=list, max_length=MAX_LIST)
    rate_limit: RateLimit | None = None

    # a field validator, so that the 422 names the field (`limits`)
    _one_limit_per_resource_and_period = field_validator("limits")(one_per_resource_and_period)


class KeyLimitUsage(BaseModel):
    """A key's standing against one of its limits, in the window that holds now."""

    resource: Resource
    period: LimitPeriod
    used: int
    amount: int
    remaining: int
    resets_at: AwareDatetime | None = Field(description="The next window's start; null for `once`.")


def window_of(period: LimitPeriod, moment: datetime, tz: ZoneInfo) -> tuple[str, datetime | None]:
    """The window of `period` that `moment` falls in: its name (the counter's key) and when it ends
    (None for `once`). Day, ISO week and month start at 00:00 in the platform time zone."""
    local = moment.astimezone(tz)
    if period is LimitPeriod.ONCE:
        return "once", None
    if period is LimitPeriod.MONTH:
        name = period_of(moment, tz)
        return name, period_bounds(name, tz)[1]
    day = datetime(local.year, local.month, local.day, tzinfo=tz)
    if period is LimitPeriod.DAY:
        return day.date().isoformat(), _next_midnight(day, 1, tz)
    year, week, weekday = local.isocalendar()
    monday = day - timedelta(days=weekday - 1)
    return f"{year:04d}-W{week:02d}", _next_midnight(monday, 7, tz)


def _next_midnight(day: datetime, days: int, tz: ZoneInfo) -> datetime:
    # Add calendar days to the date, not 24 h steps: a DST change makes a local day 23 or 25 h long.
    date = day.date() + timedelta(days=days)
    return datetime(date.year, date.month, date.day, tzinfo=tz)


def model_allowed(patterns: Sequence[str], model: str) -> bool:
    """Whether `model` (`provider/model`) is one a key with these `allowed_models` may use: an
    empty list allows every model; `provider/model` allows exactly that one, `provider/*` every
    model of that provider. Exact and case-sensitive: an allowlist that matched loosely could only
    widen a key. The edge (verify, authorize) and metering (flagging served usage) both judge with it."""
    if not patterns:
        return True
    provider, sep, name = model.partition("/")
    wildcard = f"{provider}/*" if sep and provider and name else None
    return any(p == model or p == wildcard for p in patterns)
