"""(v4) The edge's projection of each key lineage's standing against its keys' own limits
(quota.v1 KeyQuotaState), and the gate on them. Everything here is keyed by the lineage
(keys.v1 KeyState.lineage), not the key: a key made by rotation is judged where its predecessor's
spending stands, and the two keys of a rotation's grace period share one count and one admission.

The limits themselves (amount, period) are the key's keys.v1 state, which every replica applies
the moment keys answers a PATCH; `used` and `reserved` are quota's, per window. A state of an
earlier window counts nothing used in the current one (day, week and month start from 0; `once`
has one window), though its open reservations still hold, as the account's period rollover does
(quota_gate.py). api_calls limits get the account's treatment: the calls admitted here after the
state's watermark count as used (`_Admissions`), and with Redis the replicas share the admissions
of the key's limit window in the same script and round trip as the account's (admissions.py), so
a key's api_calls limit has the same bound as the account's: 0 overshoot.
"""

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID
from zoneinfo import ZoneInfo

from contracts.common import Resource
from contracts.events import KeyQuotaState, order_of
from contracts.key_limits import KeyLimit, KeyLimitUsage, LimitPeriod, window_of
from services.edge.quota_gate import CallsView, _Admissions, _pending


@dataclass(frozen=True, slots=True)
class KeyStanding:
    """A key's standing against one of its limits in the window that holds now."""

    limit: KeyLimit
    window: str
    resets_at: datetime | None
    used: int  # with the api_calls admitted here and not yet counted
    reserved: int

    @property
    def remaining(self) -> int:
        return max(0, self.limit.amount - self.used - self.reserved)

    def usage(self) -> KeyLimitUsage:
        """As key objects show it: `used` is what was counted (open reservations not in it);
        `remaining` is what is left once the reservations are held too."""
        limit = self.limit
        return KeyLimitUsage(
            resource=limit.resource,
            period=limit.period,
            used=self.used,
            amount=limit.amount,
            remaining=self.remaining,
            resets_at=self.resets_at,
        )


class KeyQuotaProjection:
    def __init__(self, tz: ZoneInfo) -> None:
        self._tz = tz
        self._states: dict[tuple[UUID, Resource, LimitPeriod], KeyQuotaState] = {}
        # api_calls admitted by this process, per (key, period): `_Admissions.period` holds the window
        self._admitted: dict[tuple[UUID, LimitPeriod], _Admissions] = {}

    def apply(self, state: KeyQuotaState) -> None:
        slot = (state.api_key_id, state.resource, state.period)
        current = self._states.get(slot)
        if current is not None and order_of(current) > order_of(state):
            return
        if state.removed:
            self._states.pop(slot, None)
            self._admitted.pop((state.api_key_id, state.period), None)
            return
        self._states[slot] = state
        entry = self._admitted.get((state.api_key_id, state.period))
        if state.resource is Resource.API_CALLS and entry is not None and entry.period == state.window:
            while entry.after_watermark and entry.after_watermark[0] <= state.time:
                entry.after_watermark.popleft()

    def get(self, lineage_id: UUID, resource: Resource, period: LimitPeriod) -> KeyQuotaState | None:
        return self._states.get((lineage_id, resource, period))

    def view(self, lineage_id: UUID, limit: KeyLimit, now: datetime) -> CallsView:
        """The limit's standing as an admission's input (quota_gate.CallsView): `subject` names the
        key and limit, `period` the window, `total` the limit's amount."""
        window, _ = window_of(limit.period, now, self._tz)
        state = self._states.get((lineage_id, limit.resource, limit.period))
        subject = f"k:{lineage_id}:{limit.resource.value}:{limit.period.value}"
        if state is None:
            return CallsView(lineage_id, window, None, 0, 0, limit.amount, subject)
        if state.window != window:  # a new window starts from 0; open reservations still hold
            return CallsView(lineage_id, window, None, 0, state.reserved, limit.amount, subject)
        return CallsView(lineage_id, window, state.time, state.used, state.reserved, limit.amount, subject)

    def standing(self, lineage_id: UUID, limit: KeyLimit, now: datetime) -> KeyStanding:
        window, resets_at = window_of(limit.period, now, self._tz)
        view = self.view(lineage_id, limit, now)
        used = view.used
        if limit.resource is Resource.API_CALLS:
            used += _pending(view, self._admitted.get((lineage_id, limit.period)))
        return KeyStanding(limit, window, resets_at, used, view.reserved)

    def refusing(
        self, lineage_id: UUID, limits: list[KeyLimit], resource: Resource, cost: int, now: datetime
    ) -> KeyStanding | None:
        """The first of the key's limits on `resource` that refuses a call needing `cost` more of
        it: exhausted (used + reserved >= amount), or used + reserved + cost > amount; None: all fit."""
        for limit in limits:
            if limit.resource is not resource:
                continue
            standing = self.standing(lineage_id, limit, now)
            taken = standing.used + standing.reserved
            if taken >= limit.amount or taken + cost > limit.amount:
                return standing
        return None

    def calls_views(self, lineage_id: UUID, limits: list[KeyLimit], now: datetime) -> list[CallsView]:
        """The admissions a call of this key needs besides its account's: one per api_calls limit."""
        return [self.view(lineage_id, limit, now) for limit in limits if limit.resource is Resource.API_CALLS]

    def admit_call(self, lineage_id: UUID, limits: list[KeyLimit], now: datetime) -> KeyStanding | None:
        """This process's own admission of one call against the key's api_calls limits (no Redis):
        the refusing limit's standing, or None once the call is counted against every one."""
        refused = self.refusing(lineage_id, limits, Resource.API_CALLS, 1, now)
        if refused is not None:
            return refused
        for limit in limits:
            if limit.resource is Resource.API_CALLS:
                window, _ = window_of(limit.period, now, self._tz)
                entry = self._admitted.get((lineage_id, limit.period))
                if entry is None or entry.period != window:
                    entry = self._admitted[(lineage_id, limit.period)] = _Admissions(window)
                entry.count += 1
                entry.after_watermark.append(now)
        return None

    def give_back(self, lineage_id: UUID, limits: list[KeyLimit], admitted_at: datetime) -> None:
        """A call admitted here ended refused: its places in the key's limits are free again."""
        for limit in limits:
            if limit.resource is not Resource.API_CALLS:
                continue
            entry = self._admitted.get((lineage_id, limit.period))
            if entry is None or entry.period != window_of(limit.period, admitted_at, self._tz)[0]:
                continue
            entry.count -= 1
            if admitted_at in entry.after_watermark:
                entry.after_watermark.remove(admitted_at)
