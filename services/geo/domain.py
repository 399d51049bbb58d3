"""Pure rules of GEO projects: each one holds one unit of the `geo_projects` stock."""

from datetime import datetime
from uuid import UUID

from contracts.common import Resource
from contracts.events import UsageEvent

SOURCE = "geo"


def usage_delta(account_id: UUID, delta: int, now: datetime) -> UsageEvent:
    """+1 when a project is created, -1 when it is deleted (a signed delta of a stock)."""
    return UsageEvent(time=now, account_id=account_id, resource=Resource.GEO_PROJECTS, quantity=delta, source=SOURCE)
