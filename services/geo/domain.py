"""Pure rules of GEO projects: each one holds one unit of the `geo_projects` stock, and an
account never holds more than its total (plan + packages)."""

from datetime import datetime
from uuid import UUID

from contracts.common import Resource
from contracts.domain_errors import Forbidden
from contracts.errors import ErrorCode
from contracts.events import UsageEvent
from contracts.quota_api import InsufficientQuotaDetails, quota_links

SOURCE = "geo"
RESOURCE = Resource.GEO_PROJECTS


class ProjectsExhausted(Forbidden):
    """403 insufficient_quota: the account holds its whole `geo_projects` total (same body as the edge's gate)."""

    def __init__(self, used: int, total: int, period_end: datetime, console_url: str) -> None:
        details = InsufficientQuotaDetails(
            resource=RESOURCE, used=used, total=total, period_end=period_end, links=quota_links(console_url, RESOURCE)
        )
        super().__init__(
            f"The {RESOURCE.value} quota of this period is exhausted ({used} of {total} used); "
            "upgrade the plan or buy a quota package.",
            code=ErrorCode.INSUFFICIENT_QUOTA,
            details=details.body(),
        )


def may_create(live: int, total: int) -> bool:
    """One more project fits while the live ones are fewer than the total."""
    return live < total


def usage_delta(account_id: UUID, delta: int, now: datetime) -> UsageEvent:
    """+1 when a project is created, -1 when it is deleted (a signed delta of a stock)."""
    return UsageEvent(time=now, account_id=account_id, resource=RESOURCE, quantity=delta, source=SOURCE)
