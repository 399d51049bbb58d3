"""The plan catalogue (tiers, prices, quotas, rate limits), parsed from the shipped plans.toml."""

import tomllib
from decimal import Decimal
from functools import cache
from importlib import resources

from pydantic import BaseModel, ConfigDict

from contracts.common import Resource, Tier, UserType
from contracts.rate_limit import RateLimit


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True)

    tier: Tier
    monthly_price: Decimal
    currency: str
    quotas: dict[Resource, int]
    rate_limit: RateLimit


def user_type_may_take(user_type: UserType, tier: Tier) -> bool:
    """Version 12 of the rules: an individual user may not be on the enterprise tier (API.md,
    409 user_type_plan_mismatch). Billing checks it on orders and switches, keys on user-type changes."""
    return not (user_type is UserType.INDIVIDUAL and tier is Tier.ENTERPRISE)


TIER_ORDER: tuple[Tier, ...] = (Tier.FREE, Tier.BASIC, Tier.PROFESSIONAL, Tier.ENTERPRISE)


def parse_catalogue(text: str) -> dict[Tier, Plan]:
    raw = tomllib.loads(text)
    plans = {Tier(tier): Plan(tier=Tier(tier), currency=raw["currency"], **body) for tier, body in raw["tiers"].items()}
    missing = [t for t in TIER_ORDER if t not in plans]
    if missing:
        raise ValueError(f"plan catalogue lacks tiers {missing}")
    for plan in plans.values():
        if set(plan.quotas) != set(Resource):
            raise ValueError(f"plan {plan.tier} must set a quota for every resource")
    return plans


@cache
def catalogue() -> dict[Tier, Plan]:
    """The catalogue shipped with the package (read once; the file is part of the contract)."""
    return parse_catalogue(resources.files("contracts").joinpath("plans.toml").read_text())
