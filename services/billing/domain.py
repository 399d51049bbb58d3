"""Pure billing rules: the version-12 user-type rule, proration, package prices, switches.

Every path that can put an account on a tier (order creation, payment, switch) calls
`ensure_plan_allowed`, under the account's row lock, so no path and no race bypasses it.
"""

import hashlib
import json
import tomllib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from enum import Enum
from functools import cache
from importlib import resources
from typing import Any, Protocol
from uuid import UUID

from contracts import keyset_cursor
from contracts.billing_api import InvoiceLine, Order
from contracts.common import Resource, Tier, UserType
from contracts.domain_errors import Conflict, DomainError, Invalid, PaymentRequired
from contracts.errors import ErrorCode
from contracts.plans import Plan, user_type_may_take

CENT = Decimal("0.01")


class BillingRuleError(DomainError):
    """A request the billing rules refuse (each subclass also names its contract base)."""


class UserTypePlanMismatch(BillingRuleError, Conflict):
    def __init__(self, tier: Tier) -> None:
        super().__init__(
            f"Individual accounts cannot use the {tier.value} tier. Change your user type to enterprise first "
            "(PUT /api/account/user-type), then order or switch again.",
            code=ErrorCode.USER_TYPE_PLAN_MISMATCH,
        )


class BillingConflict(BillingRuleError, Conflict):
    """409 conflict: not an upgrade, a stale order, a plan changed since the order."""


class InvalidPackage(BillingRuleError, Invalid):
    """422: a package amount that is not whole units or too large for one order."""


class OrderToPay(PaymentRequired):
    """402: the switch is an upgrade; the pending order to pay is in details.order."""

    def __init__(self, order: Order) -> None:
        super().__init__(
            f"Switching to {order.plan.value if order.plan else 'this plan'} costs {order.amount} {order.currency} "
            "this period; pay the order.",
            details={"order": order.model_dump(mode="json")},
        )
        self.order = order


class ChargeDeclined(PaymentRequired):
    """402: the provider refused the payer's charge; nothing was charged, the order is still pending."""

    def __init__(self, order: Order) -> None:
        super().__init__(
            "The payment was declined; nothing was charged. Pay the order again once the payment method is fixed.",
            details={"order": order.model_dump(mode="json")},
        )


class KeyReused(Conflict):
    """The Idempotency-Key was used for another request."""

    def __init__(self) -> None:
        super().__init__(
            "This Idempotency-Key was already used with another request; send a new key for a new request.",
            code=ErrorCode.IDEMPOTENCY_KEY_REUSED,
        )


# ---- Idempotency-Key of order creation and payment (API.md v2) ------------------------------------
# A key is scoped per account and route. The first request with a key stores a digest of what it
# asked (path + canonical body) and, in the same transaction as its effects, its response; a retry
# with the same key and request gets that response back and changes nothing; the same key with
# another request is 409 `idempotency_key_reused`. Only successes are remembered: a refused request
# changed nothing, so a retry simply asks again. Rows are kept `RETENTION_SECONDS` (store.py).
MAX_KEY_LENGTH = 255
RETENTION_SECONDS = 24 * 3600
HEADER_DESCRIPTION = (
    f"Optional, 1..{MAX_KEY_LENGTH} characters (422 otherwise). A retry with the same key and the same request "
    "returns the first successful response and charges nothing more; the same key with another request is 409 "
    "`idempotency_key_reused`. Keys are per account and route, kept 24 hours; a refused request is not remembered."
)


@dataclass(frozen=True, slots=True)
class Idempotency:
    """One request's key: the scope (route), the key and the digest of what it asks."""

    route: str
    key: str
    fingerprint: str

    @classmethod
    def of(cls, key: str | None, route: str, path: str, body: Any = None) -> "Idempotency | None":
        if key is None:
            return None
        canonical = json.dumps({"path": path, "body": body}, sort_keys=True, separators=(",", ":"))
        return cls(route, key, hashlib.sha256(canonical.encode()).hexdigest())


def ensure_plan_allowed(user_type: UserType, tier: Tier) -> None:
    """Version 12: an individual user can neither order nor switch to the enterprise tier."""
    if not user_type_may_take(user_type, tier):
        raise UserTypePlanMismatch(tier)


def prorate(old_price: Decimal, new_price: Decimal, now: datetime, start: datetime, end: datetime) -> Decimal:
    """Upgrade amount = (new - old monthly price) x (end - now) / (end - start), in exact Decimal
    arithmetic on microseconds, rounded once at the end to cents (half up). Never negative:
    a downgrade costs nothing and refunds nothing. `now` outside the period is clamped into it."""
    difference = new_price - old_price
    if difference <= 0:
        return Decimal("0.00")
    # In UTC: aware datetimes of one zone subtract as wall clocks, which would count a month
    # with a DST change an hour long or short and misprice every upgrade in it.
    whole = _micros(end.astimezone(UTC) - start.astimezone(UTC))
    left = min(max(_micros(end.astimezone(UTC) - now.astimezone(UTC)), 0), whole)
    return (difference * Decimal(left) / Decimal(whole)).quantize(CENT, rounding=ROUND_HALF_UP)


def _micros(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


@dataclass(frozen=True)
class PackagePrice:
    unit: int
    unit_price: Decimal


@cache
def package_prices() -> dict[Resource, PackagePrice]:
    raw = tomllib.loads(resources.files("services.billing").joinpath("packages.toml").read_text())
    return {Resource(name): PackagePrice(int(b["unit"]), Decimal(b["unit_price"])) for name, b in raw["resources"].items()}


MAX_ORDER_AMOUNT = Decimal(10) ** 12  # billing.orders.amount is numeric(14, 2)
MAX_PACKAGE_QUANTITY = 2**63 - 1  # billing.orders.quantity is a bigint


def package_amount(resource: Resource, amount: int, prices: dict[Resource, PackagePrice] | None = None) -> Decimal:
    price = (prices or package_prices())[resource]
    if amount <= 0 or amount % price.unit:
        raise InvalidPackage(f"A {resource.value} package is a positive whole multiple of {price.unit} units.")
    total = (price.unit_price * amount / price.unit).quantize(CENT, rounding=ROUND_HALF_UP)
    if amount > MAX_PACKAGE_QUANTITY or total >= MAX_ORDER_AMOUNT:  # else the INSERT overflows: a 500
        raise InvalidPackage(f"A {resource.value} package of {amount} units is too large for one order.")
    return total


class SwitchKind(Enum):
    UNCHANGED = "unchanged"
    IMMEDIATE = "immediate"  # a downgrade or a change to a plan of the same price: nothing to pay
    # An upgrade whose prorated amount rounds to 0.00 (the last minutes of a period): its 0.00
    # order is made and paid at once, with its invoice and audit entries, like any upgrade's.
    FREE_UPGRADE = "free_upgrade"
    NEEDS_PAYMENT = "needs_payment"


def classify_switch(user_type: UserType, current: Plan, target: Plan, upgrade_amount: Decimal) -> SwitchKind:
    ensure_plan_allowed(user_type, target.tier)
    if target.tier is current.tier:
        return SwitchKind.UNCHANGED
    if target.monthly_price <= current.monthly_price:
        return SwitchKind.IMMEDIATE
    return SwitchKind.FREE_UPGRADE if upgrade_amount <= 0 else SwitchKind.NEEDS_PAYMENT


def ensure_upgrade(current: Plan, target: Plan) -> None:
    """A plan_upgrade order must raise the price; cheaper or equal changes go through switch."""
    if target.monthly_price <= current.monthly_price:
        raise BillingConflict(
            f"{target.tier.value} is not an upgrade of {current.tier.value}; use POST /api/billing/subscription/switch.",
        )


# ---- renewals (an addition beyond the contract: docs/api.md, "Renewals") ----------------------------
# A renewal whose charge is declined stays pending and is tried again FIRST_RETRY later, then twice
# as long each time up to MAX_RETRY, until GRACE after it was made: a last attempt then, and if the
# payer declines that too the account goes to free. A provider that fails (not the payer) is tried
# on with the same backoff and never ends a plan.
#
# The grace is earned (`grace_earned`): only an account that paid the full price of this plan, or
# of a dearer one, for the period before keeps the plan while its renewal is retried. A renewal
# declined with nothing of that behind it (the plan came by a prorated upgrade: 0.00 in a period's
# last minute, or half the price mid-period) puts the account on free at once: the grace's 3 days
# of a whole period's quota would otherwise be given away, every month and to every new account.
# Such a renewal is not tried again by the job; paid in the console during its period it puts its
# plan back (`restores_plan`).
GRACE = timedelta(days=3)
FIRST_RETRY = timedelta(hours=1)
MAX_RETRY = timedelta(hours=12)


def renewal_due(order: "OrderLike", now: datetime) -> bool:
    """The job charges this renewal now: pending, not lapsed, its next attempt come."""
    return (
        order.kind == "plan_renewal"
        and order.status == "pending"
        and order.lapsed_at is None
        and order.next_attempt_at is not None
        and order.next_attempt_at <= now
    )


def grace_over(order: "OrderLike", now: datetime) -> bool:
    return now >= order.created_at + GRACE


def previous_period(period: str) -> str:
    """The period before `period` (`YYYY-MM`)."""
    year, month = (int(p) for p in period.split("-"))
    return f"{year - (month == 1):04d}-{(month - 2) % 12 + 1:02d}"


def grace_earned(renewed: Plan, paid_before: Plan | None) -> bool:
    """A declined renewal of `renewed` keeps the plan through the grace only if the account paid,
    for the period before the renewal's, a renewal (the full monthly price) of `paid_before` and
    that plan costs at least as much. Not an upgrade's proration, which may be 0.00 (the period's
    last minute): nor the same-plan renewal of a cheaper plan with a late upgrade on top (9.90 a
    month would buy 3 days of enterprise). A period that passed with nothing charged (the job down
    all of it) earns no grace either: nothing was paid for it."""
    return paid_before is not None and paid_before.monthly_price >= renewed.monthly_price


def restores_plan(order: "OrderLike") -> bool:
    """Paying this order puts its plan back: a renewal declined with no grace earned, for which the
    account was put on free at once."""
    return order.kind == "plan_renewal" and order.plan_dropped_at is not None


def next_attempt(order: "OrderLike", now: datetime) -> datetime:
    """After the attempt number `order.attempts + 1` failed: the next one, never past the grace's end
    while the grace lasts (the last attempt is at its end)."""
    delay = min(FIRST_RETRY * (1 << min(order.attempts, 16)), MAX_RETRY)
    end = order.created_at + GRACE
    return min(now + delay, end) if now < end else now + delay


class OrderLike(Protocol):
    """What the renewal rules read of an order (store.OrderRow)."""

    @property
    def kind(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def created_at(self) -> datetime: ...
    @property
    def attempts(self) -> int: ...
    @property
    def next_attempt_at(self) -> datetime | None: ...
    @property
    def lapsed_at(self) -> datetime | None: ...
    @property
    def plan_dropped_at(self) -> datetime | None: ...


# ---- (v2) the package catalogue, the order history's cursor, invoices --------------------------------
@cache
def package_currency() -> str:
    raw = tomllib.loads(resources.files("services.billing").joinpath("packages.toml").read_text())
    return str(raw["currency"])


@dataclass(frozen=True)
class Seller:
    id: str  # names the gapless counter
    prefix: str
    name: str
    address: str
    email: str
    tax_id: str


@cache
def seller() -> Seller:
    raw = tomllib.loads(resources.files("services.billing").joinpath("seller.toml").read_text())["seller"]
    return Seller(**{k: str(raw[k]) for k in ("id", "prefix", "name", "address", "email", "tax_id")})


def invoice_number(prefix: str, number: int) -> str:
    return f"{prefix}-{number:06d}"


def invoice_lines(order: Order) -> list[InvoiceLine]:
    """One line per order: the plan upgrade (prorated, so quantity 1 at the amount), or the
    packages bought (quantity = packages, unit price = the amount over them: the price of the order,
    whatever packages.toml says today)."""
    if order.package is not None:
        packages = max(order.package.amount // package_prices()[order.package.resource].unit, 1)
        label = order.package.resource.value.replace("_", " ")
        return [
            InvoiceLine(
                description=f"{label} quota package x{packages} ({order.package.amount} units, period {_month(order)})",
                quantity=packages,
                unit_price=(order.amount / packages).quantize(CENT, rounding=ROUND_HALF_UP),
                amount=order.amount,
            )
        ]
    assert order.plan is not None
    if order.kind == "plan_renewal":
        description = f"{order.plan.value} plan, period {_month(order)}"
    else:
        previous = order.previous_plan.value if order.previous_plan else "free"
        description = f"Upgrade from {previous} to {order.plan.value}, prorated to the end of period {_month(order)}"
    return [InvoiceLine(description=description, quantity=1, unit_price=order.amount, amount=order.amount)]


def _month(order: Order) -> str:
    return f"{order.period.start.year:04d}-{order.period.start.month:02d}"


MAX_PAGE = 100


def decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    try:
        return keyset_cursor.decode(cursor)
    except ValueError as exc:
        raise Invalid("The cursor is not one this API gave; start again without it.") from exc
