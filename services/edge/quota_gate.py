"""The quota projection (from quota.v1): is this account's resource exhausted this period?

Between a call and the state that counts it lies the pipeline (calls.v1 -> quota -> quota.v1),
a few tens of milliseconds in which a projection alone would let a burst through. So the gate
also counts the api_calls it admits itself: a state's `time` is the latest event time quota has
counted, and admissions after it are added to the state's `used` until a newer state covers
them. Within one process this bounds the overshoot to the calls admitted concurrently with the
crossing; across N edge replicas, to what the other replicas admit during the pipeline delay.
`admit_call` is that admission (it records); `is_blocked` only answers.

(v2) Open reservations count as used for every resource: a state's `reserved` is added to its
`used`. With several replicas the api_calls admissions are shared instead (services/edge/
admissions.py, in the rate limiter's Redis): `calls_view` is what this process knows of the
account's state, the input of that shared admission.
"""

from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID
from zoneinfo import ZoneInfo

from contracts.common import STOCK_RESOURCES, Resource, Tier
from contracts.events import QuotaState
from contracts.period import bounds_of
from contracts.plans import catalogue


@dataclass(frozen=True, slots=True)
class CallsView:
    """An account's api_calls as this process's projection has them for the current period:
    `watermark` is the latest call time the state has counted (admissions up to it are in `used`)."""

    account_id: UUID
    period: str
    watermark: datetime | None  # None: no state of this period yet (nothing counted)
    used: int
    reserved: int
    total: int


class QuotaProjection:
    """(account, resource) -> latest state. A block holds only within its own period, so the
    monthly reset needs no event: a new period simply finds no block for itself."""

    def __init__(self, tz: ZoneInfo) -> None:
        self._tz = tz
        self._states: dict[tuple[UUID, Resource], QuotaState] = {}
        # api_calls this process admitted that no state has counted yet: per account, the period
        # they were admitted in and their times, oldest first.
        self._admitted: dict[UUID, tuple[str, deque[datetime]]] = {}
        # Accounts that never changed plan have no state until their first event: the free tier.
        self._free = catalogue()[Tier.FREE].quotas
        self._default_calls_total = self._free[Resource.API_CALLS]
        # The current period and its bounds in UTC: a call compares two instants instead of
        # converting to the platform zone.
        self._span: tuple[datetime, datetime, str] | None = None

    def _period(self, now: datetime) -> str:
        span = self._span
        if span is None or not span[0] <= now < span[1]:
            period, start, end = bounds_of(now, self._tz)
            span = self._span = (start.astimezone(UTC), end.astimezone(UTC), period)
        return span[2]

    def apply(self, state: QuotaState) -> None:
        key = (state.account_id, state.resource)
        current = self._states.get(key)
        if current is not None and (current.period, current.time) > (state.period, state.time):
            return
        self._states[key] = state
        if state.resource is Resource.API_CALLS and state.account_id in self._admitted:
            admitted = self._admitted[state.account_id][1]
            while admitted and admitted[0] <= state.time:
                admitted.popleft()

    def get(self, account_id: UUID, resource: Resource) -> QuotaState | None:
        return self._states.get((account_id, resource))

    def is_blocked(self, account_id: UUID, resource: Resource, now: datetime) -> bool:
        """Whether `resource` is exhausted at `now` (a pure question: nothing is recorded; for
        api_calls the calls admitted here and not yet counted by a state count as used)."""
        if resource is Resource.API_CALLS:
            period = self._period(now)
            entry = self._admitted.get(account_id)
            pending = len(entry[1]) if entry is not None and entry[0] == period else 0
            return self._calls_exhausted(account_id, period, pending)
        state = self._states.get((account_id, resource))
        if state is None or not (state.blocked or state.used + state.reserved >= state.total):
            return False
        # Flows reset with the period; a stock's block carries over until the level falls.
        return resource in STOCK_RESOURCES or state.period == self._period(now)

    def admit_call(self, account_id: UUID, now: datetime) -> bool:
        """Admit one API call at `now` if the api_calls quota has room, counting it locally until
        a state covers it; False (and nothing counted) when the quota is exhausted."""
        period = self._period(now)
        entry = self._admitted.get(account_id)
        if entry is None or entry[0] != period:  # last period's admissions do not count in this one
            entry = self._admitted[account_id] = (period, deque())
        if self._calls_exhausted(account_id, period, len(entry[1])):
            return False
        entry[1].append(now)
        return True

    def _calls_exhausted(self, account_id: UUID, period: str, pending: int) -> bool:
        view = self._view(account_id, period)
        return view.used + view.reserved + pending >= view.total

    def calls_view(self, account_id: UUID, now: datetime) -> CallsView:
        return self._view(account_id, self._period(now))

    def _view(self, account_id: UUID, period: str) -> CallsView:
        state = self._states.get((account_id, Resource.API_CALLS))
        if state is None:
            return CallsView(account_id, period, None, 0, 0, self._default_calls_total)
        if state.period != period:  # a new period: the flow starts again (open reservations still hold)
            return CallsView(account_id, period, None, 0, state.reserved, state.total)
        return CallsView(account_id, period, state.time, state.used, state.reserved, state.total)

    def standing(self, account_id: UUID, resource: Resource, now: datetime) -> tuple[int, int]:
        """(used, total) of `resource` this period as this process knows them: a flow starts
        again in a new period, a stock carries its level over; api_calls include the calls
        admitted here and not yet counted; an account without a state is on the free plan."""
        period = self._period(now)
        state = self._states.get((account_id, resource))
        if state is None:
            used, total = 0, self._free[resource]
        elif state.period != period and resource not in STOCK_RESOURCES:
            used, total = 0, state.total
        else:
            used, total = state.used, state.total
        if resource is Resource.API_CALLS:
            entry = self._admitted.get(account_id)
            used += len(entry[1]) if entry is not None and entry[0] == period else 0
        return used, total

    def period_end(self, now: datetime) -> datetime:
        """The end of the period `now` falls in, in the platform zone."""
        self._period(now)
        assert self._span is not None
        return self._span[1].astimezone(self._tz)

    def pending_calls(self, account_id: UUID) -> int:
        """api_calls admitted here and not yet counted by a state (for tests and benchmarks)."""
        entry = self._admitted.get(account_id)
        return 0 if entry is None else len(entry[1])
