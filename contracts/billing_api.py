"""Payloads of the billing endpoints (API.md, "Billing and plans"). Money is a decimal string."""

from decimal import Decimal
from typing import Annotated, Literal
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, PositiveInt

from contracts.common import Resource, Tier, UserType
from contracts.quota_api import PeriodRange
from contracts.rate_limit import RateLimit


class PlanOut(BaseModel):
    tier: Tier
    monthly_price: Decimal
    currency: str
    quotas: dict[Resource, int]
    rate_limit: RateLimit


class PlanList(BaseModel):
    items: list[PlanOut]


class Subscription(BaseModel):
    plan: Tier
    user_type: UserType
    period: PeriodRange


class Package(BaseModel):
    model_config = ConfigDict(frozen=True)

    resource: Resource
    amount: PositiveInt = Field(description="Units of the resource; a whole multiple of the package unit of that resource.")


class PlanUpgradeOrderIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["plan_upgrade"]
    plan: Tier


class PackageOrderIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["quota_package"]
    package: Package


OrderIn = Annotated[PlanUpgradeOrderIn | PackageOrderIn, Field(discriminator="kind")]


class Order(BaseModel):
    id: UUID
    kind: Literal["plan_upgrade", "quota_package", "plan_renewal"] = Field(
        description="`plan_renewal` (an addition beyond the contract): the platform's charge of the plan's full monthly "
        "price at the start of a period, made by billing itself, never by a request."
    )
    status: Literal["pending", "paid"]
    amount: Decimal = Field(description='Decimal string with 2 places, e.g. "12.50".')
    currency: str
    plan: Tier | None = Field(default=None, description="plan_upgrade: the plan bought; plan_renewal: the plan renewed.")
    previous_plan: Tier | None = Field(default=None, description="plan_upgrade: the plan the amount was prorated from.")
    package: Package | None = None
    period: PeriodRange = Field(description="The period the order applies to (proration basis, package validity).")
    created_at: AwareDatetime
    paid_at: AwareDatetime | None = None


class SwitchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    plan: Tier


# ---- (v2) money users can check: the package catalogue, the order history, invoices -------------
class PackageItem(BaseModel):
    resource: Resource
    unit: PositiveInt = Field(description="Units in one package; an order's amount is a whole multiple of it.")
    unit_price: Decimal = Field(description="Price of one package (of `unit` units), decimal string.")


class PackageList(BaseModel):
    currency: str
    items: list[PackageItem]


class OrderList(BaseModel):
    items: list[Order] = Field(description="Newest first.")
    next_cursor: str | None = Field(default=None, description="Pass as `cursor` for the next page; null on the last page.")


class Party(BaseModel):
    """Seller or buyer as printed on an invoice."""

    name: str
    address: str | None = None
    email: str | None = None
    tax_id: str | None = None
    account_id: UUID | None = Field(default=None, description="Buyer: the account billed.")
    user_type: UserType | None = Field(default=None, description="Buyer: the account's user type at payment.")


class InvoiceLine(BaseModel):
    description: str
    quantity: int
    unit_price: Decimal
    amount: Decimal


class Invoice(BaseModel):
    number: str = Field(description="Gapless per seller: PREFIX-000001, -000002, ... in payment order.")
    order_id: UUID
    issued_at: AwareDatetime = Field(description="When the order was paid.")
    seller: Party
    buyer: Party
    lines: list[InvoiceLine]
    total: Decimal
    currency: str
