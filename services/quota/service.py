"""The quota service's use cases: count events, apply billing facts, publish states, report.

Each use case runs in one transaction that first locks the accounts it touches, then writes,
then publishes the new states (and crossings) and only then commits: states of one account
reach quota.v1 in the order they were computed, and a crash before the commit simply replays
the batch (the counters did not move; the published states are re-published, the crossing
events carry deterministic ids).
"""

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID, uuid4

from faststream.kafka import KafkaBroker
from psycopg_pool import AsyncConnectionPool

from contracts.common import Resource
from contracts.events import CallEvent, PackagePurchased, PlanChanged, QuotaState, QuotaThresholdCrossed, UsageEvent
from contracts.quota_api import PeriodRange, QuotaItem, QuotaReport
from contracts.topics import QUOTA, QUOTA_THRESHOLDS
from services.quota import domain, store
from services.quota.domain import Clock
from services.runtime.platform.settings import Settings


@dataclass(frozen=True, slots=True)
class Reservation:
    id: UUID
    account_id: UUID
    resource: Resource
    amount: int
    expires_at: datetime


class QuotaService:
    def __init__(self, pool: AsyncConnectionPool, broker: KafkaBroker, settings: Settings, clock: Clock) -> None:
        self.pool = pool
        self.broker = broker
        self.settings = settings
        # Swappable on purpose: tests move the service into another period.
        self.clock = clock

    def current_period(self) -> str:
        return domain.period_of(self.clock(), self.settings.tz)

    # ---- consumption -------------------------------------------------------------------------
    async def count(self, events: list[UsageEvent | CallEvent]) -> None:
        """Count a batch of usage and call events exactly once each."""
        if not events:
            return
        period = self.current_period()
        async with self.pool.connection() as conn, conn.transaction():
            await store.lock_accounts(conn, (e.account_id for e in events))
            fresh = await store.mark_processed(conn, list({e.id for e in events}))
            unique = {e.id: e for e in events if e.id in fresh}  # a batch may hold one event twice
            await store.add_deltas(conn, domain.deltas(unique.values(), self.settings.tz))
            # A counted usage event settles its reservation: the actual quantity is now in `used`
            # and the held amount is released (only for fresh events: idempotent on the event id).
            released = await store.settle_reservations(
                conn,
                ((e.reservation_id, e.account_id) for e in unique.values() if isinstance(e, UsageEvent) and e.reservation_id),
            )
            # Re-publish even for duplicates: a crash after publishing and before committing
            # offsets leaves nothing to recount but the state may never have been sent.
            touched = {(e.account_id, r) for e in events for r in self._resources_of(e)} | released
            await self._publish_states(conn, touched, period)

    @staticmethod
    def _resources_of(event: UsageEvent | CallEvent) -> Iterable[Resource]:
        return (Resource.API_CALLS,) if isinstance(event, CallEvent) else (event.resource,)

    async def apply_plan(self, event: PlanChanged) -> None:
        period = self.current_period()
        async with self.pool.connection() as conn, conn.transaction():
            await store.lock_accounts(conn, [event.account_id])
            await store.mark_processed(conn, [event.id])
            changed = await store.set_plan(conn, event.account_id, event.plan, event.quotas, event.time)
            touched = {(event.account_id, r) for r in Resource}
            await self._publish_states(conn, touched, period, totals_changed=changed)

    async def apply_package(self, event: PackagePurchased) -> None:
        period = self.current_period()
        async with self.pool.connection() as conn, conn.transaction():
            await store.lock_accounts(conn, [event.account_id])
            await store.mark_processed(conn, [event.id])
            added = await store.add_package(conn, event.order_id, event.account_id, event.resource, event.period, event.amount)
            await self._publish_states(conn, {(event.account_id, event.resource)}, period, totals_changed=added)

    # ---- reservations (v2) ----------------------------------------------------------------------
    async def reserve(
        self, account_id: UUID, resource: Resource, amount: int, ttl_seconds: int, owner_id: UUID | None = None
    ) -> Reservation:
        """Hold `amount` of `resource` for `ttl_seconds`, or raise InsufficientQuota when
        used + reserved + amount > total. Under the account's row lock, so concurrent reservations
        on any number of replicas are judged one after the other."""
        now = self.clock()
        period = self.current_period()
        async with self.pool.connection() as conn, conn.transaction():
            await store.lock_accounts(conn, [account_id])
            line = (await store.lines(conn, account_id, period))[resource]
            held = (await store.reserved(conn, account_id, now))[resource]
            if not domain.fits(line.used, held, amount, line.total):
                end = domain.period_bounds(period, self.settings.tz)[1]
                raise domain.InsufficientQuota(resource, line.used, held, line.total, end)
            reservation = Reservation(uuid4(), account_id, resource, amount, now + timedelta(seconds=ttl_seconds))
            await store.add_reservation(conn, reservation.id, account_id, resource, amount, owner_id, now, reservation.expires_at)
            await self._publish_states(conn, {(account_id, resource)}, period)
        return reservation

    async def release(self, reservation_id: UUID, owner_id: UUID | None = None) -> bool:
        """Release an open reservation early; False when there is none of this owner by that id."""
        period = self.current_period()
        async with self.pool.connection() as conn, conn.transaction():
            account_id = await store.reservation_account(conn, reservation_id, owner_id)
            if account_id is None:
                return False
            await store.lock_accounts(conn, [account_id])  # first the account, as every writer does
            resource = await store.delete_reservation(conn, reservation_id, owner_id)
            if resource is None:  # settled or expired meanwhile
                return False
            await self._publish_states(conn, {(account_id, resource)}, period)
        return True

    async def expire(self, limit: int = 500) -> int:
        """One sweep: drop reservations past their expiry and publish the freed states; returns
        how many (account, resource) states changed. One replica sweeps at a time (advisory
        try-lock, as services/runtime/platform/pruner.py); the others skip the pass."""
        now = self.clock()
        period = self.current_period()
        async with self.pool.connection() as conn, conn.transaction():
            if not await store.try_lock(conn, "quota.reservations.expire"):
                return 0
            accounts = await store.expired_accounts(conn, now, limit)
            if not accounts:
                return 0
            await store.lock_accounts(conn, accounts)
            freed = await store.delete_expired(conn, accounts, now)
            await self._publish_states(conn, freed, period)
        return len(freed)

    # ---- publication ---------------------------------------------------------------------------
    async def _publish_states(
        self, conn: store.Conn, touched: set[tuple[UUID, Resource]], period: str, *, totals_changed: bool = False
    ) -> None:
        now = self.clock()
        sends = []
        by_account: dict[UUID, set[Resource]] = {}
        for account_id, resource in touched:
            by_account.setdefault(account_id, set()).add(resource)
        for account_id, resources in sorted(by_account.items()):
            lines = await store.lines(conn, account_id, period)
            held = await store.reserved(conn, account_id, now)
            marks = await store.marks(conn, account_id, period)
            for resource in sorted(resources):
                line = lines[resource]
                state = QuotaState(
                    # The state's time is the latest counted event's time: the edge counts its own
                    # admissions after it as not yet included (see services/edge/quota_gate.py).
                    time=line.watermark,
                    account_id=account_id,
                    resource=resource,
                    period=period,
                    total=line.total,
                    used=line.used,
                    reserved=held[resource],
                    blocked=domain.is_blocked(line.used, held[resource], line.total),
                )
                sends.append(self._send(QUOTA.name, f"{account_id}:{resource.value}", state.model_dump_json()))
                mark = marks.get(resource, 0)
                if totals_changed:
                    # A bigger total lowers the rate: later crossings are announced from there.
                    await store.set_mark(conn, account_id, resource, period, domain.percent_floor(line.used, line.total))
                    continue
                pct = domain.crossing(mark, line.used, line.total)
                if pct is not None:
                    await store.set_mark(conn, account_id, resource, period, pct)
                    crossed = QuotaThresholdCrossed(
                        id=domain.threshold_event_id(account_id, resource, period, pct),
                        time=now,
                        account_id=account_id,
                        resource=resource,
                        period=period,
                        threshold_pct=pct,
                        used=line.used,
                        total=line.total,
                    )
                    sends.append(self._send(QUOTA_THRESHOLDS.name, str(account_id), crossed.model_dump_json()))
        await asyncio.gather(*sends)

    async def _send(self, topic: str, key: str, payload: str) -> None:
        await self.broker.publish(payload.encode(), self.settings.topic(topic), key=key.encode())

    # ---- queries -------------------------------------------------------------------------------
    async def report(self, account_id: UUID) -> QuotaReport:
        period = self.current_period()
        start, end = domain.period_bounds(period, self.settings.tz)
        async with self.pool.connection() as conn:
            lines = await store.lines(conn, account_id, period)
            await conn.rollback()
        items = []
        for resource in Resource:
            line = lines[resource]
            rate = domain.usage_rate(line.used, line.total)
            items.append(
                QuotaItem(
                    resource=resource,
                    total=line.total,
                    used=line.used,
                    remaining=max(line.total - line.used, 0),
                    usage_rate=float(rate),
                    status="exhausted" if domain.is_exhausted(line.used, line.total) else "available",
                    band=domain.band(rate),
                )
            )
        return QuotaReport(period=PeriodRange(start=start, end=end), items=items)
