"""The quota projection (from quota.v1): is this account's resource exhausted this period?

Between a call and the state that counts it lies the pipeline (calls.v1 -> quota -> quota.v1),
a few tens of milliseconds in which a projection alone would let a burst through. So the gate
also counts the api_calls it admits itself, two ways, and takes the larger:
- its admissions this period (less those given back: calls that ended refused), which in one
  process are exactly quota's count plus the calls in flight, in whatever order quota counts them;
- the state's `used` plus its admissions after the state's watermark (a state's `time` is the
  latest event time quota has counted), which still holds when other replicas' calls are in
  `used` too: across N edge replicas the overshoot is what the others admit during one pipeline
  delay.
`admit_call` is that admission (it records); `is_blocked` only answers.

(v2) Open reservations count as used for every resource: a state's `reserved` is added to its
`used`. With several replicas the api_calls admissions are shared instead (services/edge/
admissions.py, in the rate limiter's Redis): `calls_view` is what this process knows of the
account's state, the input of that shared admission.

Totals come from billing.v1 (billing_totals.BillingTotals, quota's own rule) for an account it
has spoken of, and from the state otherwise: a payment or a downgrade is in force the moment this
process applies its billing.v1 event, not one quota.v1 round trip later. `used` and `reserved`
are quota's, so a resource is exhausted when used + reserved >= that total.
"""

from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from uuid import UUID
from zoneinfo import ZoneInfo

from contracts.common import STOCK_RESOURCES, Resource, Tier
from contracts.events import QuotaState
from contracts.period import bounds_of
from contracts.plans import catalogue
from services.edge.billing_totals import BillingTotals


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
    # (v4) a key's own api_calls limit: `k:<key id>:<period>` (its admissions' own Redis hash); "" the account's
    subject: str = ""


@dataclass(slots=True)
class _Admissions:
    """An account's api_calls admitted by this process in `period`."""

    period: str
    count: int = 0  # admitted and not given back
    after_watermark: deque[datetime] = field(default_factory=deque)  # their times, until a state covers them


def _pending(view: CallsView, entry: _Admissions | None) -> int:
    """This process's admissions of `view`'s period that its state has not counted (the larger of
    the two counts in the module's docstring)."""
    if entry is None or entry.period != view.period:
        return 0
    return max(len(entry.after_watermark), entry.count - view.used)


class QuotaProjection:
    """(account, resource) -> latest state. A block holds only within its own period, so the
    monthly reset needs no event: a new period simply finds no block for itself."""

    def __init__(self, tz: ZoneInfo, totals: BillingTotals | None = None) -> None:
        self._tz = tz
        self._totals = totals
        self._states: dict[tuple[UUID, Resource], QuotaState] = {}
        # api_calls this process admitted, per account: see _Admissions.
        self._admitted: dict[UUID, _Admissions] = {}
        # Accounts that never changed plan have no state until their first event: the free tier.
        self._free = catalogue()[Tier.FREE].quotas
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
            after = self._admitted[state.account_id].after_watermark
            while after and after[0] <= state.time:
                after.popleft()

    def get(self, account_id: UUID, resource: Resource) -> QuotaState | None:
        return self._states.get((account_id, resource))

    def is_blocked(self, account_id: UUID, resource: Resource, now: datetime) -> bool:
        """Whether `resource` is exhausted at `now` (a pure question: nothing is recorded; for
        api_calls the calls admitted here and not yet counted by a state count as used)."""
        if resource is Resource.API_CALLS:
            period = self._period(now)
            return self._calls_exhausted(self._view(account_id, period), self._admitted.get(account_id))
        state = self._states.get((account_id, resource))
        if state is None:
            return False
        period = self._period(now)
        # Flows reset with the period; a stock's level carries over, against this period's total.
        if resource not in STOCK_RESOURCES and state.period != period:
            return False
        return state.used + state.reserved >= self._total(account_id, resource, period, state)

    def lacks_room(self, account_id: UUID, resource: Resource, cost: int, now: datetime) -> bool:
        """Whether a call that needs `cost` more of `resource` is refused: the resource is
        exhausted, or (a flow, cost > 0) used + reserved + cost > total. Nothing is recorded."""
        if self.is_blocked(account_id, resource, now):
            return True
        if cost <= 0 or resource in STOCK_RESOURCES:
            return False
        used, reserved, total = self.position(account_id, resource, now)
        return used + reserved + cost > total

    def position(self, account_id: UUID, resource: Resource, now: datetime) -> tuple[int, int, int]:
        """(used, reserved, total) of `resource` this period as this process knows them (`standing`
        with the open reservations)."""
        used, total = self.standing(account_id, resource, now)
        state = self._states.get((account_id, resource))
        return used, 0 if state is None else state.reserved, total

    def admit_call(self, account_id: UUID, now: datetime) -> bool:
        """Admit one API call at `now` if the api_calls quota has room, counting it locally until
        a state covers it; False (and nothing counted) when the quota is exhausted."""
        period = self._period(now)
        entry = self._admitted.get(account_id)
        if entry is None or entry.period != period:  # last period's admissions do not count in this one
            entry = self._admitted[account_id] = _Admissions(period)
        if self._calls_exhausted(self._view(account_id, period), entry):
            return False
        entry.count += 1
        entry.after_watermark.append(now)
        return True

    def give_back(self, account_id: UUID, admitted_at: datetime) -> None:
        """The call admitted at `admitted_at` ended refused: quota will not count it, so its place
        is free again (nothing if its period is over)."""
        entry = self._admitted.get(account_id)
        if entry is None or entry.period != self._period(admitted_at):
            return
        entry.count -= 1
        if admitted_at in entry.after_watermark:
            entry.after_watermark.remove(admitted_at)

    def _calls_exhausted(self, view: CallsView, entry: _Admissions | None) -> bool:
        return view.used + view.reserved + _pending(view, entry) >= view.total

    def calls_view(self, account_id: UUID, now: datetime) -> CallsView:
        return self._view(account_id, self._period(now))

    def _view(self, account_id: UUID, period: str) -> CallsView:
        state = self._states.get((account_id, Resource.API_CALLS))
        total = self._total(account_id, Resource.API_CALLS, period, state)
        if state is None:
            return CallsView(account_id, period, None, 0, 0, total)
        if state.period != period:  # a new period: the flow starts again (open reservations still hold)
            return CallsView(account_id, period, None, 0, state.reserved, total)
        return CallsView(account_id, period, state.time, state.used, state.reserved, total)

    def _total(self, account_id: UUID, resource: Resource, period: str, state: QuotaState | None) -> int:
        """billing.v1's total of `period` when it knows the account (in force at once), else the
        state's, else the free plan's."""
        known = None if self._totals is None else self._totals.total(account_id, resource, period)
        if known is not None:
            return known
        return self._free[resource] if state is None else state.total

    def standing(self, account_id: UUID, resource: Resource, now: datetime) -> tuple[int, int]:
        """(used, total) of `resource` this period as this process knows them: a flow starts
        again in a new period, a stock carries its level over; api_calls include the calls
        admitted here and not yet counted; an account without a state is on the free plan."""
        period = self._period(now)
        state = self._states.get((account_id, resource))
        total = self._total(account_id, resource, period, state)
        used = 0 if state is None or (state.period != period and resource not in STOCK_RESOURCES) else state.used
        if resource is Resource.API_CALLS:
            used += _pending(self._view(account_id, period), self._admitted.get(account_id))
        return used, total

    def period_end(self, now: datetime) -> datetime:
        """The end of the period `now` falls in, in the platform zone."""
        self._period(now)
        assert self._span is not None
        return self._span[1].astimezone(self._tz)

    def pending_calls(self, account_id: UUID) -> int:
        """api_calls admitted here and not yet counted by a state (for tests and benchmarks)."""
        entry = self._admitted.get(account_id)
        return 0 if entry is None else _pending(self._view(account_id, entry.period), entry)
