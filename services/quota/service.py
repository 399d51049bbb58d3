"""The quota service's use cases: count events, apply billing facts, publish states, report.

Each use case runs in one transaction that first locks the accounts it touches, then writes,
then publishes the new states (and crossings) and only then commits: states of one account
reach quota.v1 in the order they were computed, and a crash before the commit simply replays
the batch (the counters did not move; the published states are re-published, the crossing
events carry deterministic ids).

An event counts in the period of its own time, and that period's thresholds are the ones it
crosses: a call at 23:59:58 on Jan 31 counted at 00:00:01 on Feb 1 announces January's crossing,
for January. quota.v1 carries the states of the current period (on this service's clock), the
one the edge gates.
"""

import asyncio
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID, uuid4
from zoneinfo import ZoneInfo

from contracts.clock import Clock
from contracts.common import Resource
from contracts.domain_errors import NotFound
from contracts.events import (
    KeyQuotaState,
    KeyState,
    PackagePurchased,
    PlanChanged,
    QuotaState,
    QuotaThresholdCrossed,
)
from contracts.fast_events import Call, Usage
from contracts.key_limits import KeyLimit, LimitPeriod, window_of
from contracts.period import period_bounds, period_of
from contracts.quota_api import PeriodRange, QuotaItem, QuotaReport
from contracts.topics import QUOTA, QUOTA_THRESHOLDS
from services.quota import domain
from services.quota.publisher import KafkaPublisher
from services.quota.store import Held, KeyRulesRow, Line, QuotaStore, QuotaTx


@dataclass(frozen=True, slots=True)
class Reservation:
    id: UUID
    account_id: UUID
    resource: Resource
    amount: int
    expires_at: datetime
    api_key_id: UUID | None = None


def key_record(lineage_id: UUID, resource: Resource, period: LimitPeriod) -> str:
    """quota.v1's record key of a key lineage's standing against one limit (compacted: the newest
    wins). The lineage's id is its first key's id, so a key never rotated keeps its record key."""
    return f"key:{lineage_id}:{resource.value}:{period.value}"


@dataclass(frozen=True, slots=True)
class _LineagePlan:
    """A lineage whose standings a publication sends: its account, live keys, and the limits to
    publish (`live`) and to publish removed (`gone`)."""

    lineage_id: UUID
    account_id: UUID
    keys: list[KeyRulesRow]
    live: list[KeyLimit]
    gone: Collection[KeyLimit]


# A live key's keys.v1 state as this process's edge holds it (KeyProjection.by_id), None unknown.
KeyStates = Callable[[UUID], KeyState | None]
# How long a reservation waits for news of a key this process has not heard of: the contract's
# bound for a keys.v1 change to reach every replica ("never more than 1 s", API.md).
KEY_NEWS_BOUND_S = 1.0

# An account's total of a resource in a period as billing.v1 says it, None when it said nothing of
# the account (the edge's BillingTotals.total).
Totals = Callable[[UUID, Resource, str], int | None]


class QuotaService:
    def __init__(
        self,
        store: QuotaStore,
        publisher: KafkaPublisher,
        clock: Clock,
        tz: ZoneInfo,
        console_url: str,
        totals: Totals | None = None,
        keys: KeyStates | None = None,
        key_news_bound_s: float = KEY_NEWS_BOUND_S,
    ) -> None:
        self._store = store
        self._publisher = publisher
        self._clock = clock
        self._tz = tz
        self._console_url = console_url  # the links of a refusal's details
        # A payment is in force once billing.v1 has it (its 200 waits for that): the reads and the
        # reservations judge by billing.v1's totals where known, not by this service's copy, which
        # its billing.v1 consumer updates a moment later.
        self._totals = totals
        # A reservation may name a key quota's keys.v1 consumer has not applied yet (verify, on an
        # edge that has, handed out its id a moment ago): the edge of this process is asked too.
        self._keys = keys
        self._key_news_s = key_news_bound_s
        self._day: str | None = None  # the day window the last window check saw (roll_key_windows)

    def current_period(self) -> str:
        return period_of(self._clock(), self._tz)

    # ---- consumption -------------------------------------------------------------------------
    async def count(self, events: list[domain.Counted]) -> None:
        """Count a batch of usage and call events exactly once each."""
        if not events:
            return
        period = self.current_period()
        async with self._store.transaction() as tx:
            await tx.lock_accounts(e.account_id for e in events)
            fresh = await tx.mark_processed(list({e.id for e in events}))
            unique = {e.id: e for e in events if e.id in fresh}  # a batch may hold one event twice
            counted = domain.deltas(unique.values(), self._tz)
            await tx.add_deltas(counted)
            # (v4) the same events against their keys' own limits, in the same transaction
            # every (key, resource) the batch charges: one key's events may be on several resources
            charged = {(c[0], c[1]) for e in events if (c := domain.event_key(e)) is not None}
            rules = await tx.key_rules(key for key, _ in charged)
            charges = {
                k: domain.KeyCharge(row.account_id, row.lineage_id, row.limits)
                for k, row in rules.items()
                if not row.deleted and row.limits
            }
            await tx.add_key_deltas(domain.key_deltas(unique.values(), charges, self._tz))
            # A counted usage event settles its reservation: the actual quantity is now in `used`
            # and the held amount is released (only for fresh events: idempotent on the event id; only
            # a reservation of the event's own account and resource: the usage it held room for).
            released = await tx.settle_reservations(
                (
                    (e.reservation_id, e.account_id, e.resource)
                    for e in unique.values()
                    if isinstance(e, Usage) and e.reservation_id
                ),
            )
            # Re-publish even for duplicates: a crash after publishing and before committing
            # offsets leaves nothing to recount but the state may never have been sent.
            touched = {(e.account_id, r) for e in events for r in self._resources_of(e)} | _accounts_of(released)
            await self._publish_states(tx, touched, period)
            key_touched = {(charges[k].lineage_id, r) for k, r in charged if k in charges} | _keys_of(released)
            await self._publish_key_states(tx, key_touched)
            # An event counts in the period of its own time: one late from last month (or a few
            # seconds ahead into the next) crosses that period's thresholds, announced for it.
            # (As in the current period, a crossing is published before the commit that moves its mark.)
            now = self._clock()
            elsewhere = {
                (d.account_id, d.resource, d.period)
                for d in counted
                if d.period != period and domain.announces(d.period, now, self._tz)
            }
            await self._announce_crossings(tx, elsewhere)

    @staticmethod
    def _resources_of(event: domain.Counted) -> Iterable[Resource]:
        return (Resource.API_CALLS,) if isinstance(event, Call) else (event.resource,)

    async def apply_plan(self, event: PlanChanged) -> None:
        period = self.current_period()
        async with self._store.transaction() as tx:
            await tx.lock_accounts([event.account_id])
            await tx.mark_processed([event.id])
            changed = await tx.set_plan(event.account_id, event.plan, event.quotas, event.time, event.version)
            touched = {(event.account_id, r) for r in Resource}
            await self._publish_states(tx, touched, period, totals_changed=changed)

    async def apply_package(self, event: PackagePurchased) -> None:
        period = self.current_period()
        async with self._store.transaction() as tx:
            await tx.lock_accounts([event.account_id])
            await tx.mark_processed([event.id])
            added = await tx.add_package(event.order_id, event.account_id, event.resource, event.period, event.amount)
            await self._publish_states(tx, {(event.account_id, event.resource)}, period, totals_changed=added)

    # ---- reservations (v2) ----------------------------------------------------------------------
    async def reserve(
        self,
        account_id: UUID,
        resource: Resource,
        amount: int,
        ttl_seconds: int,
        owner_id: UUID | None = None,
        api_key_id: UUID | None = None,
    ) -> Reservation:
        """Hold `amount` of `resource` for `ttl_seconds`, or raise InsufficientQuota when
        used + reserved + amount > total. Under the account's row lock, so concurrent reservations
        on any number of replicas are judged one after the other. (v4) With `api_key_id` it must
        also fit each of the key's own limits on the resource (KeyLimitExhausted, judged first:
        the narrower bound) where its lineage stands (a rotated key shares its predecessor's
        counters and reservations), and holds room in them too."""
        if api_key_id is not None:
            await self._learn_key(api_key_id, account_id)
        now = self._clock()
        period = self.current_period()
        async with self._store.transaction() as tx:
            await tx.lock_accounts([account_id])
            lineage_id, key_limits = (
                (None, []) if api_key_id is None else await self._key_limits(tx, api_key_id, account_id, resource)
            )
            if lineage_id is not None and key_limits:
                key_held = (await tx.key_reserved([lineage_id], now))[lineage_id][resource]
                windows = [window_of(limit.period, now, self._tz) for limit in key_limits]
                key_lines = await tx.key_lines(
                    (lineage_id, resource, limit.period, window) for limit, (window, _) in zip(key_limits, windows, strict=True)
                )
                for limit, (window, resets_at) in zip(key_limits, windows, strict=True):
                    key_line = key_lines[lineage_id, resource, limit.period, window]
                    if not domain.fits(key_line.used, key_held, amount, limit.amount):
                        raise domain.KeyLimitExhausted(limit, key_line.used, key_held, resets_at, self._console_url)
            line = (await tx.lines([account_id], period))[account_id][resource]
            total = self._total(account_id, line, period)
            held = (await tx.reserved([account_id], now))[account_id][resource]
            if not domain.fits(line.used, held, amount, total):
                end = period_bounds(period, self._tz)[1]
                raise domain.InsufficientQuota(resource, line.used, held, total, end, self._console_url)
            expires_at = now + timedelta(seconds=ttl_seconds)
            reservation = Reservation(uuid4(), account_id, resource, amount, expires_at, api_key_id)
            await tx.add_reservation(
                reservation.id, account_id, resource, amount, owner_id, now, expires_at, api_key_id, lineage_id
            )
            await self._publish_states(tx, {(account_id, resource)}, period)
            if lineage_id is not None and key_limits:
                await self._publish_key_states(tx, {(lineage_id, resource)})
        return reservation

    async def _learn_key(self, api_key_id: UUID, account_id: UUID) -> None:
        """Make sure quota holds the key's keys.v1 state before a reservation names it, or raise
        NotFound. A key quota's consumer has not applied yet is taken from this process's edge
        (applied as the consumer will: the newest state wins), waiting up to the contract's bound
        for keys.v1 news to reach a replica; a key still unknown then, or another account's, is
        404, and both after that same wait: the two cannot be told apart (no existence leak). Before,
        an unknown id was accepted, its hold then counting against the limits of whichever
        account's key it turned out to be. Outside the reservation's transaction: no lock is held
        while waiting."""
        deadline = asyncio.get_running_loop().time() + self._key_news_s
        async with self._store.transaction() as tx:
            row = (await tx.key_rules([api_key_id])).get(api_key_id)
        owner = None if row is None else row.account_id
        while owner is None:
            state = None if self._keys is None else self._keys(api_key_id)
            if state is not None:
                await self.apply_key(state)
                owner = state.account_id
            elif asyncio.get_running_loop().time() >= deadline:
                break
            else:
                await asyncio.sleep(0.02)
        if owner != account_id:
            await asyncio.sleep(max(0.0, deadline - asyncio.get_running_loop().time()))
            raise NotFound("api key")

    @staticmethod
    async def _key_limits(tx: QuotaTx, api_key_id: UUID, account_id: UUID, resource: Resource) -> tuple[UUID, list[KeyLimit]]:
        """The key's lineage and its limits on `resource` (`_learn_key` made quota hold the key;
        another account's key is not found)."""
        row = (await tx.key_rules([api_key_id])).get(api_key_id)
        if row is None or row.account_id != account_id:
            raise NotFound("api key")
        return row.lineage_id, [] if row.deleted else [limit for limit in row.limits if limit.resource is resource]

    async def release(self, reservation_id: UUID, owner_id: UUID | None = None) -> bool:
        """Release an open reservation early; False when there is none of this owner by that id
        (one past its expiry is none: it stopped counting then; the sweeper deletes it)."""
        now = self._clock()
        period = self.current_period()
        async with self._store.transaction() as tx:
            account_id = await tx.reservation_account(reservation_id, owner_id, now)
            if account_id is None:
                return False
            await tx.lock_accounts([account_id])  # first the account, as every writer does
            released = await tx.delete_reservation(reservation_id, owner_id, now)
            if released is None:  # settled or expired meanwhile
                return False
            resource, api_key_id = released
            await self._publish_states(tx, {(account_id, resource)}, period)
            await self._publish_key_states(tx, _keys_of({(account_id, resource, api_key_id)}))
        return True

    async def expire(self, limit: int = 500) -> int:
        """One sweep: drop reservations past their expiry and publish the freed states; returns
        how many (account, resource) states changed. One replica sweeps at a time (advisory
        try-lock, as services/runtime/platform/pruner.py); the others skip the pass."""
        now = self._clock()
        period = self.current_period()
        if not await self._store.any_expired(now):
            return 0  # the idle pass: one read, no transaction
        async with self._store.transaction() as tx:
            if not await tx.try_lock("quota.reservations.expire"):
                return 0
            accounts = await tx.expired_accounts(now, limit)
            if not accounts:
                return 0
            await tx.lock_accounts(accounts)
            freed = await tx.delete_expired(accounts, now)
            await self._publish_states(tx, _accounts_of(freed), period)
            await self._publish_key_states(tx, _keys_of(freed))
        return len(freed)

    async def expire_all(self) -> None:
        """The sweeper's pass (every second, services/runtime/platform/periodic.py): sweep until
        nothing is left. Expired reservations stop counting at their expiry even before a pass
        (quota reads only unexpired ones); the pass publishes the freed states."""
        while await self.expire() > 0:
            pass  # more than one chunk expired: go on at once
        await self.roll_key_windows()

    # ---- (v4) limits per key --------------------------------------------------------------------
    async def apply_key(self, state: KeyState) -> None:
        """A key's state from keys.v1: keep its limits and lineage (the newest state by order_of
        wins; a redelivered or older one changes nothing) and publish its lineage's standing
        against each limit of the lineage's live keys, with `removed: true` for a limit a live key
        cleared that no live key of the lineage still has. A deleted key removes nothing: the key
        rotated from it may reach quota after its deletion (keys.v1 orders by key, not across
        keys), and the edge must go on judging that key where the lineage stands meanwhile."""
        lineage_id = state.lineage
        async with self._store.transaction() as tx:
            await tx.lock_accounts([state.account_id])
            was = await self._lineage_limits(tx, lineage_id)
            limits = [] if state.deleted else list(state.limits)
            if not await tx.set_key_rules(
                state.key_id, state.account_id, limits, state.deleted, state.version, state.time, lineage_id
            ):
                return
            now_limits = await self._lineage_limits(tx, lineage_id)
            kept = {(limit.resource, limit.period) for limit in now_limits}
            gone = [] if state.deleted else [limit for limit in was if (limit.resource, limit.period) not in kept]
            before = {(limit.resource, limit.period): limit.amount for limit in was}
            # a new limit announces nothing for usage before it; a changed amount is judged as an
            # account's new total is (a narrower one announces what usage now stands across)
            new = {(limit.resource, limit.period) for limit in now_limits if (limit.resource, limit.period) not in before}
            resized = {
                (limit.resource, limit.period)
                for limit in now_limits
                if before.get((limit.resource, limit.period), limit.amount) != limit.amount
            }
            await self._publish_key_states(
                tx,
                {(lineage_id, limit.resource) for limit in now_limits},
                removed={lineage_id: gone},
                new_limits=new,
                amounts_changed=resized,
            )

    @staticmethod
    async def _lineage_limits(tx: QuotaTx, lineage_id: UUID) -> list[KeyLimit]:
        rows = (await tx.lineage_rules([lineage_id])).get(lineage_id, [])
        return domain.lineage_limits(row.limits for row in rows if not row.deleted)

    async def roll_key_windows(self) -> None:
        """At a day's start (the first pass of the sweeper in a new day window: a week and a month
        start on one too), every limited key's standing again, in its new window, from 0: the edge
        projects the new window's state at once, as the account's period rolls over."""
        day, _ = window_of(LimitPeriod.DAY, self._clock(), self._tz)
        if self._day == day:
            return
        first, self._day = self._day is None, day
        if not first:  # a process that just started republishes nothing: the states are there
            await self._republish_keys()

    async def _republish_keys(self, chunk: int = 500) -> int:
        published = 0
        after: UUID | None = None
        while True:
            async with self._store.transaction() as tx:
                accounts = await tx.known_accounts(after, chunk)
                if not accounts:
                    return published
                await tx.lock_accounts(accounts)
                touched = await self._limited_lineages(tx, accounts)
                await self._publish_key_states(tx, touched, crossings=False)
            published += len(touched)
            after = accounts[-1]

    @staticmethod
    async def _limited_lineages(tx: QuotaTx, accounts: list[UUID]) -> set[tuple[UUID, Resource]]:
        """Every (lineage, resource) of these accounts that a live key's limit is on."""
        rows = await tx.lineage_rules(await tx.limited_lineages(accounts))
        return {
            (lineage, limit.resource) for lineage, keys in rows.items() for row in keys if not row.deleted for limit in row.limits
        }

    # ---- republishing (docs/architecture.md, "Kafka is transport") ------------------------------
    async def republish(self, topics: Collection[str] = (QUOTA.name,), chunk: int = 500) -> dict[str, int]:
        """quota.v1 again from Postgres: the current period's state of every resource of every
        account quota knows, `chunk` accounts per transaction (each locked, as a count locks them,
        so a batch being counted publishes after, never before). No crossing is announced: the
        marks say which were already."""
        unknown = sorted(set(topics) - {QUOTA.name})
        if unknown:
            raise ValueError(f"the quota service does not own {unknown}")
        if not topics:
            return {}
        period = self.current_period()
        published = 0
        after: UUID | None = None
        while True:
            async with self._store.transaction() as tx:
                accounts = await tx.known_accounts(after, chunk)
                if not accounts:
                    return {QUOTA.name: published}
                await tx.lock_accounts(accounts)
                touched = {(account_id, resource) for account_id in accounts for resource in Resource}
                await self._publish_states(tx, touched, period, crossings=False)
                key_touched = await self._limited_lineages(tx, accounts)
                await self._publish_key_states(tx, key_touched, crossings=False)
            published += len(touched) + len(key_touched)
            after = accounts[-1]

    async def held_states(self) -> dict[str, int]:
        """How many states quota.v1 should hold at least: one per known account (state_guard.py)."""
        async with self._store.transaction() as tx:
            return {QUOTA.name: await tx.count_accounts()}

    # ---- publication ---------------------------------------------------------------------------
    async def _publish_states(
        self,
        tx: QuotaTx,
        touched: set[tuple[UUID, Resource]],
        period: str,
        *,
        totals_changed: bool = False,
        crossings: bool = True,
    ) -> None:
        now = self._clock()
        sends: list[Awaitable[None]] = []
        moved: list[tuple[UUID, Resource, str, int]] = []  # threshold marks to move, written together
        by_account: dict[UUID, set[Resource]] = {}
        for account_id, resource in touched:
            by_account.setdefault(account_id, set()).add(resource)
        # each kind read once for all the accounts (set-based: not five round trips per account)
        lines_of = await tx.lines(by_account, period)
        held_of = await tx.reserved(by_account, now)
        marks_of = await tx.marks(by_account, period)
        for account_id, resources in sorted(by_account.items()):
            lines, held, marks = lines_of[account_id], held_of[account_id], marks_of[account_id]
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
                sends.append(self._publisher.publish(QUOTA, f"{account_id}:{resource.value}", state.model_dump_json()))
                mark, rate = marks.get(resource, 0), domain.percent_floor(line.used, line.total)
                if totals_changed and (rate < mark or line.used <= 0):
                    # A bigger total lowers the rate: later crossings are announced from there. A
                    # smaller one (a downgrade) raises it: what usage now stands across is announced
                    # below (nothing used, nothing crossed: a zero quota is "100%" of nothing).
                    moved.append((account_id, resource, period, rate))
                    continue
                if not crossings:
                    continue
                self._crossing(account_id, resource, period, line, mark, now, moved, sends)
        await tx.set_marks(moved)  # before the sends, as each mark was: a crossing is published after its mark moved
        await asyncio.gather(*sends)

    async def _publish_key_states(
        self,
        tx: QuotaTx,
        touched: set[tuple[UUID, Resource]],
        *,
        removed: Mapping[UUID, Collection[KeyLimit]] | None = None,
        new_limits: Collection[tuple[Resource, LimitPeriod]] = (),
        amounts_changed: Collection[tuple[Resource, LimitPeriod]] = (),
        crossings: bool = True,
    ) -> None:
        """Each touched key lineage's standing against its limits on the touched resources (the
        limits of its live keys: domain.lineage_limits), in the window that holds now (and
        `removed: true` for `removed` limits), and the crossings of whole percents of a limit in
        that window, announced for each live key of the lineage that has the limit (alert rules
        name a key). A new limit moves its mark to where it stands, announcing nothing. A limit
        whose amount changed is judged as an account's new total is: a wider one lowers the rate
        and moves the mark down to it silently (later crossings are announced from there); a
        narrower one raises it, and the highest percent usage now stands across is announced, once
        per threshold (event ids are deterministic), as a downgrade is: a key's alert rules watch
        its limit, and narrowing it past 80% must fire the 80% rule."""
        now = self._clock()
        account_period = period_of(now, self._tz)
        sends: list[Awaitable[None]] = []
        by_lineage: dict[UUID, set[Resource]] = {}
        for lineage_id, resource in touched:
            by_lineage.setdefault(lineage_id, set()).add(resource)
        removed = removed or {}
        for lineage_id in removed:
            by_lineage.setdefault(lineage_id, set())
        rows_of = await tx.lineage_rules(by_lineage)
        publishing: list[_LineagePlan] = []
        for lineage_id, resources in sorted(by_lineage.items()):
            rows = rows_of.get(lineage_id, [])
            if not rows:
                continue
            keys = [row for row in rows if not row.deleted]
            live = [limit for limit in domain.lineage_limits(row.limits for row in keys) if limit.resource in resources]
            gone = removed.get(lineage_id, ())
            if live or gone:
                publishing.append(_LineagePlan(lineage_id, rows[0].account_id, keys, live, gone))
        if not publishing:
            return
        # (issue 38) each kind read (and written) once for all the lineages: not a version, a
        # reservations read and a counter read per limit for each key
        windows = {period: window_of(period, now, self._tz) for period in LimitPeriod}
        versions = await tx.next_key_state_versions(p.lineage_id for p in publishing)
        held_of = await tx.key_reserved([p.lineage_id for p in publishing], now)
        lines_of = await tx.key_lines(
            (p.lineage_id, limit.resource, limit.period, windows[limit.period][0]) for p in publishing for limit in p.live
        )
        marks: list[tuple[UUID, Resource, LimitPeriod, str, int]] = []  # moved together, before the sends
        for plan in publishing:
            lineage_id, account_id, version, held = (
                plan.lineage_id,
                plan.account_id,
                versions[plan.lineage_id],
                held_of[plan.lineage_id],
            )
            for limit in plan.gone:
                window, resets_at = windows[limit.period]
                forgotten = KeyQuotaState(
                    time=now,
                    account_id=account_id,
                    api_key_id=lineage_id,
                    resource=limit.resource,
                    period=limit.period,
                    window=window,
                    amount=limit.amount,
                    used=0,
                    blocked=False,
                    resets_at=resets_at,
                    removed=True,
                    version=version,
                )
                sends.append(
                    self._publisher.publish(
                        QUOTA, key_record(lineage_id, limit.resource, limit.period), forgotten.model_dump_json()
                    )
                )
            for limit in plan.live:
                window, resets_at = windows[limit.period]
                line = lines_of[lineage_id, limit.resource, limit.period, window]
                reserved = held[limit.resource]
                state = KeyQuotaState(
                    # as the account's: the latest counted event's time (the edge counts its own
                    # admissions after it as not yet included)
                    time=line.watermark,
                    account_id=account_id,
                    api_key_id=lineage_id,
                    resource=limit.resource,
                    period=limit.period,
                    window=window,
                    amount=limit.amount,
                    used=line.used,
                    reserved=reserved,
                    blocked=domain.is_blocked(line.used, reserved, limit.amount),
                    resets_at=resets_at,
                    version=version,
                )
                record = key_record(lineage_id, limit.resource, limit.period)
                sends.append(self._publisher.publish(QUOTA, record, state.model_dump_json()))
                pct = domain.percent_floor(line.used, limit.amount)
                # wider (or nothing used: nothing crossed): the mark moves down to where it stands
                widened = (limit.resource, limit.period) in amounts_changed and (pct < line.mark or line.used <= 0)
                if (limit.resource, limit.period) in new_limits or widened:
                    marks.append((lineage_id, limit.resource, limit.period, window, pct))
                    continue
                pct_crossed = domain.crossing(line.mark, line.used, limit.amount) if crossings else None
                if pct_crossed is None:
                    continue
                marks.append((lineage_id, limit.resource, limit.period, window, pct_crossed))
                for key in plan.keys:
                    if not any((x.resource, x.period) == (limit.resource, limit.period) for x in key.limits):
                        continue
                    crossed = QuotaThresholdCrossed(
                        id=domain.key_threshold_event_id(key.api_key_id, limit.resource, limit.period, window, pct_crossed),
                        time=now,
                        account_id=account_id,
                        resource=limit.resource,
                        period=account_period,
                        threshold_pct=pct_crossed,
                        used=line.used,
                        total=limit.amount,
                        api_key_id=key.api_key_id,
                        limit_period=limit.period,
                        window=window,
                    )
                    sends.append(self._publisher.publish(QUOTA_THRESHOLDS, str(account_id), crossed.model_dump_json()))
        await tx.set_key_marks(marks)  # before the sends, as each mark was: a crossing is published after its mark moved
        await asyncio.gather(*sends)

    async def _announce_crossings(self, tx: QuotaTx, counted: set[tuple[UUID, Resource, str]]) -> None:
        """The crossings of periods other than the current one that a batch counted into. Their
        states are not published: quota.v1 keeps one state per account and resource (compacted),
        and the edge gates only the current period, so a past period's state would replace the
        current one there (a restarted edge would lose a block) and gate nothing itself."""
        now = self._clock()
        sends: list[Awaitable[None]] = []
        moved: list[tuple[UUID, Resource, str, int]] = []
        by_period: dict[tuple[UUID, str], set[Resource]] = {}
        for account_id, resource, period in counted:
            by_period.setdefault((account_id, period), set()).add(resource)
        lines_of: dict[tuple[UUID, str], dict[Resource, Line]] = {}
        marks_of: dict[tuple[UUID, str], dict[Resource, int]] = {}
        for period in sorted({period for _, period in by_period}):  # each kind read once per period
            accounts = [account_id for account_id, p in by_period if p == period]
            lines_of |= {(a, period): lines for a, lines in (await tx.lines(accounts, period)).items()}
            marks_of |= {(a, period): marks for a, marks in (await tx.marks(accounts, period)).items()}
        for key, resources in sorted(by_period.items()):
            account_id, period = key
            for resource in sorted(resources):
                line, mark = lines_of[key][resource], marks_of[key].get(resource, 0)
                self._crossing(account_id, resource, period, line, mark, now, moved, sends)
        await tx.set_marks(moved)
        await asyncio.gather(*sends)

    def _crossing(
        self,
        account_id: UUID,
        resource: Resource,
        period: str,
        line: Line,
        mark: int,
        now: datetime,
        moved: list[tuple[UUID, Resource, str, int]],
        sends: list[Awaitable[None]],
    ) -> None:
        """The announcement of the highest whole percent `line` crossed above `mark` in `period`,
        if any (to `sends`), with the mark moved to it (to `moved`: the caller writes the marks
        before it sends)."""
        pct = domain.crossing(mark, line.used, line.total)
        if pct is None:
            return
        moved.append((account_id, resource, period, pct))
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
        sends.append(self._publisher.publish(QUOTA_THRESHOLDS, str(account_id), crossed.model_dump_json()))

    # ---- queries -------------------------------------------------------------------------------
    def _total(self, account_id: UUID, line: Line, period: str) -> int:
        known = None if self._totals is None else self._totals(account_id, line.resource, period)
        return line.total if known is None else known

    async def report(self, account_id: UUID) -> QuotaReport:
        period = self.current_period()
        start, end = period_bounds(period, self._tz)
        async with self._store.transaction() as tx:  # read only: nothing to commit
            lines = (await tx.lines([account_id], period))[account_id]
        items = []
        for resource in Resource:
            line = lines[resource]
            total = self._total(account_id, line, period)
            rate = domain.usage_rate(line.used, total)
            items.append(
                QuotaItem(
                    resource=resource,
                    total=total,
                    used=line.used,
                    remaining=max(total - line.used, 0),
                    usage_rate=float(rate),
                    status="exhausted" if domain.is_exhausted(line.used, total) else "available",
                    band=domain.band(rate),
                )
            )
        return QuotaReport(period=PeriodRange(start=start, end=end), items=items)


def _accounts_of(held: set[Held]) -> set[tuple[UUID, Resource]]:
    return {(account_id, resource) for account_id, resource, _ in held}


def _keys_of(held: set[Held]) -> set[tuple[UUID, Resource]]:
    """The (key lineage, resource) standings released reservations held room in."""
    return {(lineage_id, resource) for _, resource, lineage_id in held if lineage_id is not None}
