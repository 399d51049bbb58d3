"""Quota totals as billing.v1 says them, so that a payment is in force on the edge at once.

quota's total of a resource is the quotas of the account's newest `plan_changed` (the free
plan's if it never changed plan) plus the packages bought for the period (services/quota/store.py,
`lines`). Every edge replays billing.v1 from the start (it is kept forever) and applies the very
same rule, so it knows a new total as soon as billing publishes it (the process that answered the
payment before its answer leaves), instead of one hop later, once quota has re-published its
states on quota.v1. `used` and `reserved` still come from quota.v1 (quota_gate.QuotaProjection).
"""

from uuid import UUID

from contracts.common import Resource, Tier
from contracts.events import PackagePurchased
from contracts.plans import catalogue
from services.edge.projections import PlanLimits

KEPT_PERIODS = 2  # an account's newest periods with packages: this one, and the last at its turn


class BillingTotals:
    def __init__(self, plans: PlanLimits) -> None:
        self._plans = plans  # the newest plan_changed of each account (the edge follows it for rate limits)
        # account -> period -> order id -> (resource, amount): one package counts once, however often delivered
        self._packages: dict[UUID, dict[str, dict[UUID, tuple[Resource, int]]]] = {}
        self._free = catalogue()[Tier.FREE].quotas

    def apply_package(self, event: PackagePurchased) -> None:
        periods = self._packages.setdefault(event.account_id, {})
        periods.setdefault(event.period, {})[event.order_id] = (event.resource, event.amount)
        for lapsed in sorted(periods)[:-KEPT_PERIODS]:  # "YYYY-MM" sorts by time
            del periods[lapsed]

    def total(self, account_id: UUID, resource: Resource, period: str) -> int | None:
        """The account's total of `resource` in `period`; None when billing.v1 has said nothing of
        the account (then quota.v1's total, or the free plan's, stands)."""
        plan = self._plans.latest(account_id)
        periods = self._packages.get(account_id)
        if plan is None and periods is None:
            return None
        quotas = self._free if plan is None else plan.quotas
        bought = periods.get(period, {}) if periods is not None else {}
        return quotas.get(resource, 0) + sum(amount for kind, amount in bought.values() if kind is resource)
