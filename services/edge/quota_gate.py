"""The quota projection (from quota.v1): is this account's resource exhausted this period?"""

from datetime import datetime
from uuid import UUID
from zoneinfo import ZoneInfo

from contracts.common import STOCK_RESOURCES, Resource
from contracts.events import QuotaState


def period_of(moment: datetime, tz: ZoneInfo) -> str:
    """The quota period (`YYYY-MM`, calendar month in the platform zone) that `moment` falls in."""
    local = moment.astimezone(tz)
    return f"{local.year:04d}-{local.month:02d}"


class QuotaProjection:
    """(account, resource) -> latest state. A block holds only within its own period, so the
    monthly reset needs no event: a new period simply finds no block for itself."""

    def __init__(self, tz: ZoneInfo) -> None:
        self._tz = tz
        self._states: dict[tuple[UUID, Resource], QuotaState] = {}

    def apply(self, state: QuotaState) -> None:
        key = (state.account_id, state.resource)
        current = self._states.get(key)
        if current is not None and (current.period, current.time) > (state.period, state.time):
            return
        self._states[key] = state

    def get(self, account_id: UUID, resource: Resource) -> QuotaState | None:
        return self._states.get((account_id, resource))

    def is_blocked(self, account_id: UUID, resource: Resource, now: datetime) -> bool:
        state = self._states.get((account_id, resource))
        if state is None or not state.blocked:
            return False
        # Flows reset with the period; a stock's block carries over until the level falls.
        return resource in STOCK_RESOURCES or state.period == period_of(now, self._tz)
