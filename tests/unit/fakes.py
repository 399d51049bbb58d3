"""Fakes of the ports the use cases take (cosmicpython's fakes): no I/O, so the unit suite runs
every use case in milliseconds. One section per service; the shared ones first."""

import asyncio
import copy
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, tzinfo
from decimal import Decimal
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

from contracts.alerts_api import Channel, Recipient
from contracts.audit import AuditContext, AuditRecorded
from contracts.common import STOCK_RESOURCES, AlertMetric, Resource, Tier, UserType
from contracts.events import AccountState, KeyState, PlanChanged, QuotaState, UsageEvent, UserState
from contracts.key_limits import KeyLimit, LimitPeriod
from contracts.plans import catalogue
from contracts.topics import Topic
from services.alerts import domain as alerts_domain
from services.alerts.service import AlertsService, TargetCheck
from services.alerts.store import Firing, Rule, RuleView
from services.billing.domain import Idempotency, KeyReused
from services.billing.payments import Charge, PaymentDeclined
from services.billing.service import BillingService
from services.billing.store import AccountRow, InvoiceRow, OrderRow, PlanRow
from services.geo.store import ProjectRow
from services.keys.attempt_logs import Counted, Entry, LocalLogs
from services.metering.domain import NO_KEY, Cursor, GroupBy
from services.metering.rollups import UsageRow, series_key
from services.metering.store import ActivityFilter, CallRow, UsageQuery
from services.quota.domain import EPOCH, Delta, KeyDelta
from services.quota.store import Held, KeyLine, KeyRulesRow, KeySlot, Line

# The caller of every write in the unit tests (a console session from a documentation address).
ACTOR = AuditContext(user_id=UUID("00000000-0000-4000-8000-0000000000a1"), ip="203.0.113.9", user_agent="unit-test")


def audit_entries(outbox: Iterable[tuple[str, bytes, bytes | None]]) -> list[AuditRecorded]:
    """The audit.v1 entries among a fake's outbox rows (topic, key, value), in order."""
    return [AuditRecorded.model_validate_json(v) for t, _k, v in outbox if t == "audit.v1" and v is not None]


class FakeClock:
    """A Clock (contracts/clock.py) that stands still until told to move."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now or datetime(2026, 11, 15, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


# ---- billing ----


class FakeOutbox:
    """The outbox relay's port: `events` holds (topic name, key, value) of every row added;
    `wakes` counts the publications asked for."""

    def __init__(self) -> None:
        self.events: list[tuple[str, bytes, bytes | None]] = []
        self.wakes = 0

    async def add(self, conn: Any, topic: Topic, key: bytes, value: bytes | None) -> int:
        self.events.append((topic.name, key, value))
        return len(self.events)

    def wake(self) -> None:
        self.wakes += 1


class FakeBillingEdge:
    """services/billing/service.py's LocalEdge: `delivered` holds the facts of each delivery."""

    def __init__(self) -> None:
        self.delivered: list[list[Any]] = []

    async def deliver(self, facts: list[Any]) -> None:
        self.delivered.append(list(facts))


class FakeBillingState:
    def __init__(self) -> None:
        self.accounts: dict[UUID, AccountRow] = {}
        self.orders: dict[UUID, OrderRow] = {}
        self.keys: dict[tuple[UUID, str, str], tuple[str, dict[str, Any] | None]] = {}
        self.invoices: dict[UUID, InvoiceRow] = {}
        self.counters: dict[str, int] = {}
        self.plan_versions: dict[UUID, int] = {}  # billing.accounts.plan_version
        self.plan_times: dict[UUID, datetime] = {}  # billing.accounts.plan_changed_at
        # keys.accounts as billing reaches it (keys migration 0011_plan_hold.sql): the user type of
        # record, and the plan billing recorded there (plan, time, version).
        self.user_types_of_record: dict[UUID, UserType] = {}
        self.plans_in_keys: dict[UUID, tuple[Tier, datetime, int]] = {}
        self.start_plans: dict[UUID, tuple[Tier, str]] = {}  # billing.accounts.start_plan, start_plan_period


class FakeBillingTx:
    """store.BillingTx in memory, on a copy of the state that is kept only if the block succeeds."""

    conn = None

    def __init__(self, state: FakeBillingState) -> None:
        self.state = state

    async def lock_account(
        self, account_id: UUID, default_user_type: UserType, default_time: datetime | None, default_version: int
    ) -> AccountRow:
        default = AccountRow(account_id, Tier.FREE, default_user_type, default_time, default_version)
        return self.state.accounts.setdefault(account_id, default)

    async def set_user_type(self, account_id: UUID, user_type: UserType, time: datetime, version: int) -> None:
        row = self.state.accounts.get(account_id)
        if row is None:
            self.state.accounts[account_id] = AccountRow(account_id, Tier.FREE, user_type, time, version)
        elif row.user_type_time is None or (row.user_type_version, row.user_type_time) < (version, time):
            self.state.accounts[account_id] = replace(row, user_type=user_type, user_type_time=time, user_type_version=version)

    async def mark_account_deleted(self, account_id: UUID, user_type: UserType, time: datetime) -> None:
        row = self.state.accounts.get(account_id) or AccountRow(account_id, Tier.FREE, user_type, None, 0)
        self.state.accounts[account_id] = replace(row, deleted_at=row.deleted_at or time)

    async def lock_user_type(self, account_id: UUID) -> UserType | None:
        return self.state.user_types_of_record.get(account_id)

    async def record_plan(self, account_id: UUID, plan: Tier, time: datetime, version: int) -> None:
        if account_id in self.state.user_types_of_record:
            self.state.plans_in_keys[account_id] = (plan, time, version)

    async def set_plan(self, account_id: UUID, plan: Tier, now: datetime, period: str) -> int:
        row = self.state.accounts[account_id]
        if self.state.start_plans.get(account_id, (None, ""))[1] != period:
            self.state.start_plans[account_id] = (row.plan, period)
        self.state.accounts[account_id] = replace(row, plan=plan)
        self.state.plan_versions[account_id] = self.state.plan_versions.get(account_id, 0) + 1
        self.state.plan_times[account_id] = now
        return self.state.plan_versions[account_id]

    async def insert_order(self, order: OrderRow) -> None:
        self.state.orders[order.id] = order

    async def lock_order(self, order_id: UUID, account_id: UUID) -> OrderRow | None:
        order = self.state.orders.get(order_id)
        return order if order is not None and order.account_id == account_id else None

    async def mark_paid(self, order_id: UUID, now: datetime, reference: str) -> None:
        order = self.state.orders[order_id]
        self.state.orders[order_id] = replace(order, status="paid", paid_at=now, next_attempt_at=None)

    async def list_orders(self, account_id: UUID, limit: int, before: tuple[datetime, UUID] | None) -> list[OrderRow]:
        mine = sorted(
            (o for o in self.state.orders.values() if o.account_id == account_id),
            key=lambda o: (o.created_at, o.id),
            reverse=True,
        )
        return [o for o in mine if before is None or (o.created_at, o.id) < before][:limit]

    async def get_order(self, order_id: UUID, account_id: UUID) -> OrderRow | None:
        return await self.lock_order(order_id, account_id)

    async def take_invoice_number(self, seller: str) -> int:
        self.state.counters[seller] = self.state.counters.get(seller, 0) + 1
        return self.state.counters[seller]

    async def insert_invoice(self, invoice: InvoiceRow) -> None:
        self.state.invoices[invoice.order_id] = invoice

    async def get_invoice(self, order_id: UUID) -> InvoiceRow | None:
        return self.state.invoices.get(order_id)

    async def claim_key(self, account_id: UUID, request: Idempotency) -> dict[str, Any] | None:
        found = self.state.keys.get((account_id, request.route, request.key))
        if found is None:
            self.state.keys[(account_id, request.route, request.key)] = (request.fingerprint, None)
            return None
        if found[0] != request.fingerprint:
            raise KeyReused()
        return found[1]

    async def remember_key(self, account_id: UUID, request: Idempotency, status: int, response: dict[str, Any]) -> None:
        self.state.keys[(account_id, request.route, request.key)] = (request.fingerprint, response)

    async def renewal_candidates(self, period: str) -> list[UUID]:
        renewed = {o.account_id for o in self.state.orders.values() if o.kind == "plan_renewal" and o.period == period}
        live = (a for a in self.state.plan_times if self.state.accounts[a].deleted_at is None)
        return sorted(a for a in live if a not in renewed)

    async def start_plan(self, account_id: UUID, period: str, start: datetime) -> Tier | None:
        plan, of = self.state.start_plans.get(account_id, (Tier.FREE, ""))
        if of == period:
            return plan
        changed = self.state.plan_times.get(account_id)
        return self.state.accounts[account_id].plan if changed is None or changed < start else None

    async def insert_renewal(self, order: OrderRow) -> bool:
        made = {(o.account_id, o.period) for o in self.state.orders.values() if o.kind == "plan_renewal"}
        if (order.account_id, order.period) in made:
            return False
        self.state.orders[order.id] = order
        return True

    async def due_renewals(self, now: datetime) -> list[tuple[UUID, UUID]]:
        due = [o for o in self.state.orders.values() if o.kind == "plan_renewal" and o.status == "pending"]
        due = [o for o in due if o.lapsed_at is None and o.next_attempt_at is not None and o.next_attempt_at <= now]
        return [(o.id, o.account_id) for o in sorted(due, key=lambda o: (o.next_attempt_at, o.id))]

    async def record_attempt(self, order_id: UUID, next_attempt_at: datetime) -> None:
        order = self.state.orders[order_id]
        self.state.orders[order_id] = replace(order, attempts=order.attempts + 1, next_attempt_at=next_attempt_at)

    async def paid_renewal_plan(self, account_id: UUID, period: str) -> Tier | None:
        for o in self.state.orders.values():
            if o.account_id == account_id and o.kind == "plan_renewal" and o.period == period and o.status == "paid":
                return o.plan
        return None

    async def drop_renewal(self, order_id: UUID, now: datetime) -> None:
        order = self.state.orders[order_id]
        self.state.orders[order_id] = replace(order, attempts=order.attempts + 1, next_attempt_at=None, plan_dropped_at=now)

    async def lapse_renewals(self, account_id: UUID, now: datetime) -> None:
        for o in list(self.state.orders.values()):
            if o.account_id == account_id and o.kind == "plan_renewal" and o.status == "pending" and o.lapsed_at is None:
                self.state.orders[o.id] = replace(o, attempts=o.attempts + 1, lapsed_at=now, next_attempt_at=None)

    async def current_plans(self) -> list[PlanRow]:
        return [
            PlanRow(a, self.state.accounts[a].plan, at, self.state.plan_versions[a])
            for a, at in sorted(self.state.plan_times.items())
        ]

    async def paid_packages(self, period: str) -> list[OrderRow]:
        return [o for o in self.state.orders.values() if o.kind == "quota_package" and o.status == "paid" and o.period == period]

    async def count_facts(self, period: str) -> int:
        return len(self.state.plan_times) + len(await self.paid_packages(period))


class FakeBillingStore:
    """store.BillingStore in memory: a transaction that raises leaves the state as it was."""

    def __init__(self) -> None:
        self.state = FakeBillingState()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[FakeBillingTx]:
        work = copy.deepcopy(self.state)
        yield FakeBillingTx(work)
        self.state = work  # reached only if the block did not raise: commit


class FakePaymentProvider:
    """A payment provider, idempotent on the order id like a real one; counts every attempt.
    `declines` makes it refuse every charge for the payer, `fails` fail as a provider down would."""

    def __init__(self) -> None:
        self.attempts = 0
        self.charges: dict[UUID, tuple[Decimal, str]] = {}
        self.declines = False
        self.fails = False

    async def charge(self, order_id: UUID, account_id: UUID, amount: Decimal, currency: str) -> Charge:
        self.attempts += 1
        if self.declines:
            raise PaymentDeclined("card declined")
        if self.fails:
            raise ConnectionError("the payment provider does not answer")
        self.charges.setdefault(order_id, (amount, currency))
        return Charge(reference=f"fake-{order_id}")


class FakeAccounts:
    """The edge's accounts.v1 projection: what it knows of each account's user type."""

    def __init__(self) -> None:
        self.states: dict[UUID, AccountState] = {}

    def get(self, account_id: UUID) -> AccountState | None:
        return self.states.get(account_id)


# ---- geo ----


class FakeGeoTx:
    conn = None

    def __init__(self, projects: dict[UUID, tuple[UUID, ProjectRow]]) -> None:
        self.projects = projects  # id -> (account id, row)
        self.locked: list[UUID] = []

    async def list_projects(self, account_id: UUID) -> list[ProjectRow]:
        rows = [row for owner, row in self.projects.values() if owner == account_id]
        return sorted(rows, key=lambda r: (r.created_at, r.id))

    async def insert_project(self, project_id: UUID, account_id: UUID, name: str, now: datetime) -> ProjectRow:
        row = ProjectRow(project_id, name, now)
        self.projects[project_id] = (account_id, row)
        return row

    async def delete_project(self, account_id: UUID, project_id: UUID) -> bool:
        found = self.projects.get(project_id)
        if found is None or found[0] != account_id:
            return False
        del self.projects[project_id]
        return True

    async def lock_account(self, account_id: UUID) -> None:
        self.locked.append(account_id)

    async def count_projects(self, account_id: UUID) -> int:
        return sum(1 for owner, _ in self.projects.values() if owner == account_id)


class FakeGeoStore:
    """store.GeoStore in memory; `locks` lists the accounts each transaction locked."""

    def __init__(self) -> None:
        self.projects: dict[UUID, tuple[UUID, ProjectRow]] = {}
        self.locks: list[UUID] = []

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[FakeGeoTx]:
        tx = FakeGeoTx(dict(self.projects))
        yield tx
        self.projects = tx.projects
        self.locks += tx.locked

    @asynccontextmanager
    async def read(self) -> AsyncIterator[FakeGeoTx]:
        yield FakeGeoTx(self.projects)


class FakeQuota:
    """The edge's quota projection: a settable total per account (`default` otherwise)."""

    def __init__(self, default: int = 3, period_end: datetime | None = None) -> None:
        self.default = default
        self.totals: dict[UUID, int] = {}
        self.end = period_end or datetime(2026, 12, 1, tzinfo=UTC)

    def standing(self, account_id: UUID, resource: Resource, now: datetime) -> tuple[int, int]:
        return 0, self.totals.get(account_id, self.default)

    def period_end(self, now: datetime) -> datetime:
        return self.end


# ---- quota ----


class FakeQuotaStore:
    """services/quota/store.py's QuotaStore in memory: `transaction()` yields the store itself
    (it implements QuotaTx's methods) and restores the state on an error, as a rollback does."""

    def __init__(self) -> None:
        self.plans: dict[UUID, tuple[dict[str, int], tuple[int, datetime]]] = {}  # quotas, (plan version, time)
        self.processed: set[UUID] = set()
        self.counters: dict[tuple[UUID, Resource, str], tuple[int, datetime]] = {}
        self.packages: dict[UUID, tuple[UUID, Resource, str, int]] = {}
        self.threshold_marks: dict[tuple[UUID, Resource, str], int] = {}
        self.reservations: dict[UUID, dict[str, Any]] = {}
        self.locked_by_other: set[str] = set()
        self.known: set[UUID] = set()  # quota.accounts: every account a use case locked
        self.expiry_checks = 0
        self.transactions = 0
        # (v4) key id -> (row, (rules version, time)); (lineage, resource, period, window) -> [used, watermark, mark];
        # lineage -> the version of its last published states
        self.key_rules_rows: dict[UUID, tuple[KeyRulesRow, tuple[int, datetime]]] = {}
        self.key_counters: dict[tuple[UUID, Resource, LimitPeriod, str], list[Any]] = {}
        self.lineage_versions: dict[UUID, int] = {}
        # how often each set-based read and write was called (the key ones: when they would send a statement)
        self.calls: Counter[str] = Counter()

    def _count(self, name: str, sent: bool) -> None:
        """A statement `name` would send (QuotaTx sends none for nothing asked)."""
        if sent:
            self.calls[name] += 1

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator["FakeQuotaStore"]:
        self.transactions += 1
        saved = copy.deepcopy({k: v for k, v in vars(self).items()})
        try:
            yield self
        except BaseException:
            vars(self).update(saved)
            raise

    async def mark_processed(self, event_ids: list[UUID]) -> set[UUID]:
        fresh = set(event_ids) - self.processed
        self.processed |= fresh
        return fresh

    async def lock_accounts(self, account_ids: Iterable[UUID]) -> None:
        self.known.update(account_ids)  # one process, no concurrency: nothing to lock, rows made

    async def known_accounts(self, after: UUID | None, limit: int) -> list[UUID]:
        return [a for a in sorted(self.known) if after is None or a > after][:limit]

    async def count_accounts(self) -> int:
        return len(self.known)

    async def add_deltas(self, deltas: list[Delta]) -> None:
        for d in deltas:
            used, last = self.counters.get((d.account_id, d.resource, d.period), (0, EPOCH))
            self.counters[(d.account_id, d.resource, d.period)] = (used + d.quantity, max(last, d.last_time))

    async def set_plan(self, account_id: UUID, plan: Tier, quotas: Mapping[Resource, int], time: datetime, version: int) -> bool:
        current = self.plans.get(account_id)
        if current is not None and current[1] >= (version, time):
            return False
        self.plans[account_id] = ({r.value: n for r, n in quotas.items()}, (version, time))
        return True

    async def add_package(self, order_id: UUID, account_id: UUID, resource: Resource, period: str, amount: int) -> bool:
        if order_id in self.packages:
            return False
        self.packages[order_id] = (account_id, resource, period, amount)
        return True

    async def lines(self, account_ids: Collection[UUID], period: str) -> dict[UUID, dict[Resource, Line]]:
        self.calls["lines"] += 1
        return {account_id: self._lines(account_id, period) for account_id in account_ids}

    def _lines(self, account_id: UUID, period: str) -> dict[Resource, Line]:
        plan = self.plans.get(account_id)
        quotas = plan[0] if plan else {r.value: n for r, n in catalogue()[Tier.FREE].quotas.items()}
        result = {}
        for resource in Resource:
            rows = [
                v
                for (a, r, p), v in self.counters.items()
                if a == account_id and r is resource and (p == period or (r in STOCK_RESOURCES and p <= period))
            ]
            used = sum(u for u, _ in rows)
            watermark = max((t for _, t in rows), default=EPOCH)
            bought = sum(n for a, r, p, n in self.packages.values() if a == account_id and r is resource and p == period)
            result[resource] = Line(resource, int(quotas.get(resource.value, 0)) + bought, max(used, 0), watermark)
        return result

    async def marks(self, account_ids: Collection[UUID], period: str) -> dict[UUID, dict[Resource, int]]:
        self.calls["marks"] += 1
        return {
            account_id: {r: pct for (a, r, p), pct in self.threshold_marks.items() if a == account_id and p == period}
            for account_id in account_ids
        }

    async def set_marks(self, marks: Iterable[tuple[UUID, Resource, str, int]]) -> None:
        self.calls["set_marks"] += 1
        for account_id, resource, period, pct in marks:
            self.threshold_marks[(account_id, resource, period)] = pct

    async def reserved(self, account_ids: Collection[UUID], now: datetime) -> dict[UUID, dict[Resource, int]]:
        self.calls["reserved"] += 1
        held = {account_id: dict.fromkeys(Resource, 0) for account_id in account_ids}
        for r in self.reservations.values():
            if r["account_id"] in held and r["expires_at"] > now:
                held[r["account_id"]][r["resource"]] += r["amount"]
        return held

    async def add_reservation(
        self,
        reservation_id: UUID,
        account_id: UUID,
        resource: Resource,
        amount: int,
        owner_id: UUID | None,
        created_at: datetime,
        expires_at: datetime,
        api_key_id: UUID | None = None,
        lineage_id: UUID | None = None,
    ) -> None:
        self.reservations[reservation_id] = {
            "lineage_id": lineage_id,
            "account_id": account_id,
            "resource": resource,
            "amount": amount,
            "owner_id": owner_id,
            "expires_at": expires_at,
            "api_key_id": api_key_id,
        }

    async def reservation_account(self, reservation_id: UUID, owner_id: UUID | None, now: datetime) -> UUID | None:
        r = self.reservations.get(reservation_id)
        return r["account_id"] if r and r["owner_id"] == owner_id and r["expires_at"] > now else None

    async def delete_reservation(
        self, reservation_id: UUID, owner_id: UUID | None, now: datetime
    ) -> tuple[Resource, UUID | None] | None:
        r = self.reservations.get(reservation_id)
        if r is None or r["owner_id"] != owner_id or r["expires_at"] <= now:
            return None
        del self.reservations[reservation_id]
        return r["resource"], r["lineage_id"]

    async def settle_reservations(self, settled: Iterable[tuple[UUID, UUID, Resource]]) -> set[Held]:
        freed = set()
        for reservation_id, account_id, resource in set(settled):
            r = self.reservations.get(reservation_id)
            if r is not None and r["account_id"] == account_id and r["resource"] is resource:
                del self.reservations[reservation_id]
                freed.add((account_id, r["resource"], r["lineage_id"]))
        return freed

    async def try_lock(self, name: str) -> bool:
        return name not in self.locked_by_other

    async def expired_accounts(self, now: datetime, limit: int) -> list[UUID]:
        return sorted({r["account_id"] for r in self.reservations.values() if r["expires_at"] <= now})[:limit]

    async def any_expired(self, now: datetime) -> bool:
        self.expiry_checks += 1
        return any(r["expires_at"] <= now for r in self.reservations.values())

    async def delete_expired(self, account_ids: list[UUID], now: datetime) -> set[Held]:
        gone = [
            self.reservations.pop(i)
            for i, r in list(self.reservations.items())
            if r["account_id"] in account_ids and r["expires_at"] <= now
        ]
        return {(r["account_id"], r["resource"], r["lineage_id"]) for r in gone}

    # (v4) limits per key, counted per key lineage
    async def key_rules(self, key_ids: Iterable[UUID]) -> dict[UUID, KeyRulesRow]:
        return {k: self.key_rules_rows[k][0] for k in set(key_ids) if k in self.key_rules_rows}

    async def lineage_rules(self, lineage_ids: Iterable[UUID]) -> dict[UUID, list[KeyRulesRow]]:
        wanted = set(lineage_ids)
        self._count("lineage_rules", bool(wanted))
        found: dict[UUID, list[KeyRulesRow]] = {}
        for key_id in sorted(self.key_rules_rows):
            row = self.key_rules_rows[key_id][0]
            if row.lineage_id in wanted:
                found.setdefault(row.lineage_id, []).append(row)
        return found

    async def set_key_rules(
        self,
        api_key_id: UUID,
        account_id: UUID,
        limits: list[KeyLimit],
        deleted: bool,
        version: int,
        time: datetime,
        lineage_id: UUID,
    ) -> bool:
        current = self.key_rules_rows.get(api_key_id)
        if current is not None and (current[1] >= (version, time) or current[0].account_id != account_id):
            return False
        self.key_rules_rows[api_key_id] = (
            KeyRulesRow(api_key_id, account_id, list(limits), deleted, lineage_id),
            (version, time),
        )
        return True

    async def limited_lineages(self, account_ids: Iterable[UUID]) -> list[UUID]:
        accounts = set(account_ids)
        return sorted(
            {
                row.lineage_id
                for row, _ in self.key_rules_rows.values()
                if row.account_id in accounts and not row.deleted and row.limits
            }
        )

    async def add_key_deltas(self, deltas: list[KeyDelta]) -> None:
        for d in deltas:
            line = self.key_counters.setdefault((d.lineage_id, d.resource, d.period, d.window), [0, EPOCH, 0])
            line[0] += d.quantity
            line[1] = max(line[1], d.last_time)

    async def key_lines(self, wanted: Iterable[KeySlot]) -> dict[KeySlot, KeyLine]:
        found = {}
        for slot in wanted:
            used, watermark, mark = self.key_counters.get(slot, [0, EPOCH, 0])
            found[slot] = KeyLine(max(used, 0), watermark, mark)
        self._count("key_lines", bool(found))
        return found

    async def set_key_marks(self, marks: Iterable[tuple[UUID, Resource, LimitPeriod, str, int]]) -> None:
        marks = list(marks)
        self._count("set_key_marks", bool(marks))
        for lineage_id, resource, period, window, pct in marks:
            self.key_counters.setdefault((lineage_id, resource, period, window), [0, EPOCH, 0])[2] = pct

    async def key_reserved(self, lineage_ids: Collection[UUID], now: datetime) -> dict[UUID, dict[Resource, int]]:
        held = {lineage_id: dict.fromkeys(Resource, 0) for lineage_id in lineage_ids}
        self._count("key_reserved", bool(held))
        for r in self.reservations.values():
            if r["lineage_id"] in held and r["expires_at"] > now:
                held[r["lineage_id"]][r["resource"]] += r["amount"]
        return held

    async def next_key_state_versions(self, lineage_ids: Iterable[UUID]) -> dict[UUID, int]:
        ids = set(lineage_ids)
        self._count("next_key_state_versions", bool(ids))
        for lineage_id in ids:
            self.lineage_versions[lineage_id] = self.lineage_versions.get(lineage_id, 0) + 1
        return {lineage_id: self.lineage_versions[lineage_id] for lineage_id in ids}


class FakePublisher:
    """KafkaPublisher in memory: what was published, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[Topic, str, str]] = []

    async def publish(self, topic: Topic, key: str, payload: str) -> None:
        self.sent.append((topic, key, payload))


# ---- alerts ----


class FakeAlertsStore:
    """services/alerts/store.py's AlertsStore in memory (`transaction()` yields the store, which
    implements AlertsTx's methods; the firings' unique (rule, threshold, period) is kept)."""

    def __init__(self) -> None:
        self.rules: dict[UUID, Rule] = {}
        self.quota_states: dict[tuple[UUID, Resource], dict[str, Any]] = {}
        self.firings: dict[tuple[UUID, int, str], dict[str, Any]] = {}
        self.deliveries: dict[UUID, dict[str, Any]] = {}
        self.notifications: dict[UUID, dict[str, Any]] = {}
        self.keys: dict[UUID, dict[str, Any]] = {}
        self.users: dict[UUID, dict[str, Any]] = {}  # users.v1: each user's account, whether removed
        self.outside_messages: dict[tuple[UUID, str], tuple[int, int]] = {}  # (account, day): (queued, suppressed)
        self.outbox: list[tuple[str, bytes, bytes | None]] = []  # (topic, key, value), rolled back with the rest

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator["FakeAlertsStore"]:
        saved = copy.deepcopy({k: v for k, v in vars(self).items()})
        try:
            yield self
        except BaseException:
            vars(self).update(saved)
            raise

    async def insert_rule(
        self,
        account_id: UUID,
        metric: AlertMetric,
        threshold_pct: int,
        channels: list[Channel],
        recipients: list[Recipient],
        created_at: datetime,
        webhook_secret: str | None = None,
        api_key_id: UUID | None = None,
    ) -> Rule:
        rule = Rule(uuid.uuid4(), account_id, metric, threshold_pct, channels, recipients, created_at, api_key_id)
        self.rules[rule.id] = rule
        return rule

    async def list_rules(self, account_id: UUID, current_windows: list[str], rule_id: UUID | None = None) -> list[RuleView]:
        views = []
        for rule in self.rules.values():
            if rule.account_id != account_id or rule_id not in (None, rule.id):
                continue
            fired = [f for f in self.firings.values() if f["rule_id"] == rule.id]
            views.append(
                RuleView(
                    rule,
                    any(f["period"] in current_windows for f in fired),
                    max((f["fired_at"] for f in fired), default=None),
                    sum(1 for d in self.deliveries.values() if d["rule_id"] == rule.id and d["status"] == "failed"),
                )
            )
        return views

    async def publish(self, topic: Topic, key: bytes, value: bytes) -> None:
        self.outbox.append((topic.name, key, value))

    async def delete_rule(self, account_id: UUID, rule_id: UUID) -> bool:
        if not await self.rule_exists(account_id, rule_id):
            return False
        del self.rules[rule_id]
        return True

    async def rule_exists(self, account_id: UUID, rule_id: UUID) -> bool:
        rule = self.rules.get(rule_id)
        return rule is not None and rule.account_id == account_id

    async def rules_for(
        self, account_id: UUID, resource: Resource, max_threshold: int, api_key_id: UUID | None = None
    ) -> list[Rule]:
        return [
            r
            for r in self.rules.values()
            if r.account_id == account_id
            and r.resource is resource
            and r.threshold_pct <= max_threshold
            and r.api_key_id == api_key_id
        ]

    async def save_quota_state(self, state: QuotaState) -> None:
        current = self.quota_states.get((state.account_id, state.resource))
        if current is None or (state.period, state.time) >= (current["period"], current["time"]):
            self.quota_states[(state.account_id, state.resource)] = {
                "period": state.period,
                "total": state.total,
                "used": state.used,
                "time": state.time,
            }

    async def quota_state(self, account_id: UUID, resource: Resource) -> dict[str, Any] | None:
        return self.quota_states.get((account_id, resource))

    async def record_firing(self, firing: Firing) -> list[UUID]:
        rule = firing.rule
        once = (rule.id, rule.threshold_pct, firing.period)
        if once in self.firings:
            return []
        self.firings[once] = {
            "rule_id": rule.id,
            "period": firing.period,
            "cause": firing.cause,
            "fired_at": datetime.now(UTC),
            "api_key_id": rule.api_key_id,
            "limit_period": firing.limit_period,
        }
        planned = alerts_domain.plan_deliveries(rule.account_id, rule.channels, rule.recipients)
        held: list[alerts_domain.PlannedDelivery] = []
        if firing.budget is not None:
            planned, held = firing.budget.split(planned)
            self.outside_messages[(rule.account_id, firing.budget.day)] = (firing.budget.queued, firing.budget.suppressed)
        ids = []
        for delivery, status in [*((p, "pending") for p in planned), *((p, "failed") for p in held)]:
            delivery_id = uuid.uuid4()
            if status == "pending":
                ids.append(delivery_id)
            self.deliveries[delivery_id] = {
                "rule_id": rule.id,
                "account_id": rule.account_id,
                "channel": delivery.channel,
                "recipient": delivery.recipient,
                "status": status,
                "last_error": firing.budget.reason() if firing.budget is not None and status == "failed" else None,
                "period": firing.period,
                "threshold_pct": rule.threshold_pct,
                "created_at": datetime.now(UTC),
                "sent_at": None,
            }
        return ids

    async def lock_outside_budget(self, account_id: UUID, day: str, per_day: int) -> alerts_domain.OutsideBudget:
        queued, suppressed = self.outside_messages.setdefault((account_id, day), (0, 0))
        return alerts_domain.OutsideBudget(day, per_day, queued, suppressed)

    async def prune_outside_budgets(self, before_day: str) -> int:
        old = [k for k in self.outside_messages if k[1] < before_day]
        for key in old:
            del self.outside_messages[key]
        return len(old)

    async def count_rules_locked(self, account_id: UUID) -> int:
        return sum(1 for r in self.rules.values() if r.account_id == account_id)

    async def fired_rules(self, rule_ids: list[UUID], period: str) -> set[UUID]:
        return {f["rule_id"] for f in self.firings.values() if f["rule_id"] in rule_ids and f["period"] == period}

    async def list_deliveries(self, account_id: UUID, rule_id: UUID) -> list[dict[str, Any]]:
        return [
            {
                "id": i,
                "time": datetime.now(UTC),
                "attempt": 0,
                "status_code": None,
                "error": d["last_error"],
                "next_attempt_at": None,
                "delivery_id": i,
                "firing_id": i,
                "attempts": 0,
                **d,
            }
            for i, d in self.deliveries.items()
            if d["rule_id"] == rule_id and d["account_id"] == account_id
        ]

    async def list_notifications(self, account_id: UUID, limit: int, unread_only: bool) -> list[dict[str, Any]]:
        rows = [n for n in self.notifications.values() if n["account_id"] == account_id and not (unread_only and n["read_at"])]
        return sorted(rows, key=lambda n: n["created_at"], reverse=True)[:limit]

    async def mark_read(self, account_id: UUID, notification_id: UUID) -> dict[str, Any] | None:
        row = self.notifications.get(notification_id)
        if row is None or row["account_id"] != account_id:
            return None
        row["read_at"] = row["read_at"] or datetime.now(UTC)
        return row

    async def save_key(self, state: KeyState) -> None:
        known = self.keys.get(state.key_id, {})
        self.keys[state.key_id] = {
            "key_id": state.key_id,
            "account_id": state.account_id,
            "created_at": state.created_at or known.get("created_at"),
            "created_by": state.created_by or known.get("created_by"),
            "masked_key": state.masked_key or known.get("masked_key"),
            "deleted": state.deleted or known.get("deleted", False),
        }

    async def is_account_key(self, account_id: UUID, key_id: UUID) -> bool:
        key = self.keys.get(key_id)
        return key is not None and key["account_id"] == account_id and not key["deleted"]

    async def save_user(self, state: UserState) -> None:
        known = self.users.get(state.user_id, {})
        self.users[state.user_id] = {"account_id": state.account_id, "removed": state.removed or known.get("removed", False)}

    async def account_users(self, account_id: UUID, user_ids: list[UUID]) -> set[UUID]:
        return {u for u in user_ids if (user := self.users.get(u)) and user["account_id"] == account_id and not user["removed"]}

    async def keys_unreminded(self, created_before: datetime, limit: int, key_id: UUID | None = None) -> list[dict[str, Any]]:
        reminded = {n["api_key_id"] for n in self.notifications.values() if n["kind"] == "key_rotation_due"}
        return [
            k
            for k in self.keys.values()
            if not k["deleted"]
            and k["created_at"] is not None
            and k["created_at"] < created_before
            and key_id in (None, k["key_id"])
            and k["key_id"] not in reminded
        ][:limit]

    async def add_rotation_notification(
        self, key_id: UUID, account_id: UUID, created_by: UUID | None, title: str, message: str, now: datetime
    ) -> bool:
        if any(n["kind"] == "key_rotation_due" and n["api_key_id"] == key_id for n in self.notifications.values()):
            return False
        nid = uuid.uuid4()
        self.notifications[nid] = {
            "id": nid,
            "account_id": account_id,
            "created_at": now,
            "title": title,
            "message": message,
            "metric": None,
            "threshold_pct": None,
            "links": {},
            "read_at": None,
            "kind": "key_rotation_due",
            "api_key_id": key_id,
        }
        return True


class FakeDeliver:
    """The dispatcher's `submit`: the delivery ids handed over after each commit."""

    def __init__(self) -> None:
        self.submitted: list[UUID] = []

    def __call__(self, delivery_ids: Iterable[UUID]) -> None:
        self.submitted += list(delivery_ids)


async def no_refusal(url: str, *, https_only: bool = False) -> str | None:
    """webhook.creation_refusal for tests: every URL may be a target."""
    return None


class AlertsWorld:
    """Alerts' use cases on fakes, the clock at `now` (days in `tz`): the store and the dispatcher's
    submissions a test reads back, and the service over them. Every webhook URL may be a target
    unless `check_target` says otherwise; the daily budget of outside messages and the cap on rules
    are the service's defaults unless given."""

    def __init__(
        self,
        now: datetime,
        tz: ZoneInfo = ZoneInfo("UTC"),
        *,
        check_target: TargetCheck = no_refusal,
        outside_messages_per_day: int = 50,
        max_rules: int = 50,
    ) -> None:
        self.clock = FakeClock(now)
        self.store = FakeAlertsStore()
        self.deliver = FakeDeliver()
        self.service = AlertsService(
            self.store,  # type: ignore[arg-type]
            self.clock,
            tz,
            check_target,
            self.deliver,
            outside_messages_per_day=outside_messages_per_day,
            max_rules=max_rules,
        )

    def submitted_channels(self) -> list[Channel]:
        """The channel of every delivery handed to the dispatcher, in order."""
        return [self.store.deliveries[i]["channel"] for i in self.deliver.submitted]


# ---- metering ----


class FakeIngestedIds:
    """The idempotency window (services/metering/store.py, IngestedIds) as a set."""

    def __init__(self) -> None:
        self.ids: set[UUID] = set()

    async def known(self, ids: list[UUID]) -> set[UUID]:
        return self.ids & set(ids)

    async def remember(self, events: list[UsageEvent]) -> int:
        fresh = {e.id for e in events} - self.ids
        self.ids |= fresh
        return len(fresh)


class FakeUsageTopic:
    """usage.v1 as a list of what was published."""

    def __init__(self) -> None:
        self.published: list[UsageEvent] = []

    async def publish(self, events: list[UsageEvent]) -> None:
        self.published += events


@dataclass(frozen=True)
class _Usage:
    account_id: UUID
    time: datetime
    provider: str
    model: str
    input_tokens: int
    output_tokens: int
    api_key_id: UUID

    @property
    def hour(self) -> datetime:
        return self.time.replace(minute=0, second=0, microsecond=0)


def _day(t: datetime) -> datetime:
    return t.replace(hour=0, minute=0, second=0, microsecond=0)


class FakeMeteringStore:
    """MeteringStore's reads over rows in memory: ai_tokens events summed per UTC hour or day
    like the rollup, ordered as the builders of domain need; calls newest first with the
    activity log's filters. Streams come in small blocks, so a series may span two of them."""

    BLOCK = 3

    def __init__(self) -> None:
        self.usage: list[_Usage] = []
        self.call_log: list[tuple[UUID, CallRow]] = []

    def add_usage(
        self,
        account_id: UUID,
        time: datetime,
        input_tokens: int,
        output_tokens: int,
        *,
        provider: str = "p",
        model: str = "m",
        api_key_id: UUID | None = None,
    ) -> None:
        self.usage.append(
            _Usage(account_id, time.astimezone(UTC), provider, model, input_tokens, output_tokens, api_key_id or NO_KEY)
        )

    def add_call(self, account_id: UUID, row: CallRow) -> None:
        self.call_log.append((account_id, row))

    async def key_usage_since(
        self, account_id: UUID, key_ids: list[UUID], starts: list[datetime]
    ) -> dict[tuple[UUID, str, datetime], int]:
        """ai_tokens of the account's usage (input + output) and admitted calls, per key and start."""
        used: dict[tuple[UUID, str, datetime], int] = {}
        for start in starts:
            for u in self.usage:
                if u.account_id == account_id and u.api_key_id in key_ids and u.time >= start:
                    k = (u.api_key_id, "ai_tokens", start)
                    used[k] = used.get(k, 0) + u.input_tokens + u.output_tokens
            for acc, row in self.call_log:
                if acc == account_id and row.api_key_id in key_ids and row.time >= start and row.error_code is None:
                    k = (row.api_key_id, "api_calls", start)
                    used[k] = used.get(k, 0) + row.count
        return used

    # ---- usage ---------------------------------------------------------------------------------
    def _sums(self, events: list[_Usage], bucket: Callable[[datetime], datetime], per_key: bool) -> list[UsageRow]:
        groups: dict[tuple[datetime, str, str, UUID | None], list[_Usage]] = {}
        for e in events:
            groups.setdefault((bucket(e.hour), e.provider, e.model, e.api_key_id if per_key else None), []).append(e)
        return [
            UsageRow(
                start=b,
                provider=p,
                model=m,
                calls=len(es),
                input_tokens=sum(e.input_tokens for e in es),
                output_tokens=sum(e.output_tokens for e in es),
                total_tokens=sum(e.input_tokens + e.output_tokens for e in es),
                api_key_id=k,
                last_time=max(e.time for e in es),
            )
            for (b, p, m, k), es in groups.items()
        ]

    def _of(self, q: UsageQuery) -> list[_Usage]:
        return [
            e
            for e in self.usage
            if e.account_id == q.account_id
            and q.start <= e.hour < q.end
            and (q.api_key_id is None or e.api_key_id == q.api_key_id)
        ]

    async def stream_usage(
        self,
        q: UsageQuery,
        *,
        per: str,
        group_by: GroupBy | None = None,
        keys: list[str] | None = None,
        at_once: bool = False,
    ) -> AsyncIterator[list[UsageRow]]:
        bucket = (lambda h: h) if per == "hour" else _day
        rows = self._sums(self._of(q), bucket, q.per_key or group_by == "api_key")
        if keys:
            rows = sorted(
                (r for r in rows if series_key(r, group_by) in keys),
                key=lambda r: (keys.index(series_key(r, group_by)), r.start),
            )
        elif group_by is not None:
            rows.sort(key=lambda r: (series_key(r, group_by), r.start))
        else:
            rows.sort(key=lambda r: (r.provider, r.model, str(r.api_key_id), r.start))
        if at_once:  # one read, one block (empty too), as the real store does
            yield rows
            return
        for i in range(0, len(rows), self.BLOCK):
            yield rows[i : i + self.BLOCK]

    async def daily_rows_split(self, q: UsageQuery, prev_end: datetime, split: datetime) -> tuple[list[UsageRow], list[UsageRow]]:
        events = [e for e in self._of(q) if e.hour < prev_end or e.hour >= split]
        before = self._sums([e for e in events if e.hour < split], _day, False)
        after = self._sums([e for e in events if e.hour >= split], _day, False)
        return before, after

    # ---- calls ---------------------------------------------------------------------------------
    def _calls(self, account_id: UUID, where: ActivityFilter, after: Cursor | None = None) -> list[CallRow]:
        rows = [
            r
            for a, r in self.call_log
            if a == account_id
            and (where.start is None or r.time >= where.start)
            and (where.end is None or r.time < where.end)
            and (where.api_key_id is None or r.api_key_id == where.api_key_id)
            and (where.ip is None or r.ip == where.ip)
            and (where.status is None or r.status == where.status)
            and (where.refused is None or (r.error_code is not None) == where.refused)
            and (after is None or (r.time, r.id) < (after.time, after.id))
        ]
        return sorted(rows, key=lambda r: (r.time, r.id), reverse=True)

    async def calls(self, account_id: UUID, where: ActivityFilter, limit: int, after: Cursor | None) -> list[CallRow]:
        return self._calls(account_id, where, after)[:limit]

    async def stream_calls(self, account_id: UUID, where: ActivityFilter) -> AsyncIterator[list[CallRow]]:
        rows = self._calls(account_id, where)
        for i in range(0, len(rows), self.BLOCK):
            yield rows[i : i + self.BLOCK]


# ---- keys ----
# The keys service's ports (services/keys/service.py: Store, LocalEdge) in memory.


_KEY_COLUMNS = (
    "id",
    "account_id",
    "name",
    "hash",
    "masked_key",
    "status",
    "expires_at",
    "delete_at",
    "created_at",
    "last_used_at",
    "created_by",
    "version",
    "rules",
    "lineage_id",
)


class FakeKeysStore:
    """services/keys/store.py's KeysStore and KeysTx in one: the same methods on dicts. A
    transaction that raises is rolled back (its rows and outbox rows too), as Postgres would.
    Rows start at version 1 and every write that changes a published state bumps it, as there."""

    def __init__(self) -> None:
        self.accounts: dict[UUID, dict[str, Any]] = {}
        self.keys: dict[UUID, dict[str, Any]] = {}
        self.tokens: dict[UUID, dict[str, Any]] = {}
        self.users: dict[UUID, dict[str, Any]] = {}
        self.outbox: list[tuple[str, bytes, bytes | None]] = []  # (topic, key, value) committed or in flight
        self.audit_log: dict[UUID, dict[str, Any]] = {}  # event id -> row, as keys.audit_log
        self.logouts: dict[tuple[UUID, str], dict[str, Any]] = {}  # keys.session_revocations

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator["FakeKeysStore"]:
        saved = copy.deepcopy(vars(self))
        try:
            yield self
        except BaseException:
            vars(self).update(saved)
            raise

    async def publish(self, topic: Topic, key: bytes, value: bytes | None) -> None:
        self.outbox.append((topic.name, key, value))

    # ---- accounts
    async def insert_account(
        self, *, account_id: UUID, email: str, password_hash: str, name: str, user_type: str, roles: list[str]
    ) -> dict[str, Any] | None:
        if any(a["email"].lower() == email.lower() and a["deleted_at"] is None for a in self.accounts.values()):
            return None
        self.accounts[account_id] = {
            "id": account_id,
            "email": email,
            "password_hash": password_hash,
            "name": name,
            "user_type": user_type,
            "roles": list(roles),
            "plan": "free",
            "plan_time": None,
            "plan_version": 0,
            "created_at": datetime(2026, 1, 1, tzinfo=UTC),
            "sessions_not_before": None,
            "version": 1,
            "deleted_at": None,
        }
        return dict(self.accounts[account_id])

    async def account_by_email(self, email: str) -> dict[str, Any] | None:
        live = (a for a in self.accounts.values() if a["email"].lower() == email.lower() and a["deleted_at"] is None)
        return next((dict(a) for a in live), None)

    async def mark_account_deleted(self, account_id: UUID, now: datetime) -> dict[str, Any]:
        row = self.accounts[account_id]
        row.update(deleted_at=now, version=row["version"] + 1)
        return dict(row)

    async def account_by_id(self, account_id: UUID, *, for_update: bool = False) -> dict[str, Any] | None:
        row = self.accounts.get(account_id)
        return None if row is None else dict(row)

    async def _update_account(self, account_id: UUID, **values: Any) -> dict[str, Any] | None:
        row = self.accounts.get(account_id)
        if row is None:
            return None
        row.update(values)
        return dict(row)

    async def set_password_hash(self, account_id: UUID, password_hash: str) -> None:
        await self._update_account(account_id, password_hash=password_hash)

    async def set_password(self, account_id: UUID, password_hash: str, sessions_not_before: datetime) -> dict[str, Any] | None:
        return await self._update_account(account_id, password_hash=password_hash, sessions_not_before=sessions_not_before)

    async def set_user_type(self, account_id: UUID, user_type: str) -> dict[str, Any] | None:
        return await self._update_account(account_id, user_type=user_type, version=self.accounts[account_id]["version"] + 1)

    async def set_roles(self, account_id: UUID, roles: list[str]) -> dict[str, Any] | None:
        return await self._update_account(account_id, roles=list(roles), version=self.accounts[account_id]["version"] + 1)

    async def set_plan(self, account_id: UUID, plan: str, time: datetime, version: int) -> None:
        row = self.accounts.get(account_id)
        if row is not None and (row["plan_time"] is None or (row["plan_version"], row["plan_time"]) < (version, time)):
            row.update(plan=plan, plan_time=time, plan_version=version)

    # ---- users
    async def insert_user(
        self, *, user_id: UUID, account_id: UUID, email: str, password_hash: str, name: str, role: str, created_at: datetime
    ) -> dict[str, Any] | None:
        if any(u["email"].lower() == email.lower() and u["removed_at"] is None for u in self.users.values()):
            return None
        self.users[user_id] = {
            "id": user_id,
            "account_id": account_id,
            "email": email,
            "password_hash": password_hash,
            "name": name,
            "role": role,
            "sessions_not_before": None,
            "created_at": created_at,
            "removed_at": None,
            "version": 1,
        }
        return dict(self.users[user_id])

    async def user_by_email(self, email: str) -> dict[str, Any] | None:
        found = (u for u in self.users.values() if u["email"].lower() == email.lower() and u["removed_at"] is None)
        return next((dict(u) for u in found), None)

    async def user_by_id(self, user_id: UUID, *, for_update: bool = False) -> dict[str, Any] | None:
        row = self.users.get(user_id)
        return None if row is None else dict(row)

    async def keep_password_hash(self, user_id: UUID, verified_hash: str, rehashed: str | None) -> dict[str, Any] | None:
        user = self.users.get(user_id)
        if user is None or user["password_hash"] != verified_hash:
            return None
        if rehashed is not None:
            user["password_hash"] = rehashed
        return dict(user)

    async def set_user_password(self, user_id: UUID, password_hash: str, sessions_not_before: datetime) -> dict[str, Any] | None:
        return await self._update_user(user_id, password_hash=password_hash, sessions_not_before=sessions_not_before)

    async def _update_user(self, user_id: UUID, **values: Any) -> dict[str, Any] | None:
        """A write of the user's published state: its version moves on."""
        row = self.users.get(user_id)
        if row is None:
            return None
        row.update(values, version=row["version"] + 1)
        return dict(row)

    async def members_of(self, account_id: UUID) -> list[dict[str, Any]]:
        live = [u for u in self.users.values() if u["account_id"] == account_id and u["removed_at"] is None]
        return [dict(u) for u in sorted(live, key=lambda u: (u["created_at"], str(u["id"])))]

    async def members_for_update(self, account_id: UUID) -> list[dict[str, Any]]:
        return await self.members_of(account_id)

    async def set_user_role(self, user_id: UUID, role: str) -> dict[str, Any] | None:
        return await self._update_user(user_id, role=role)

    async def remove_user(self, user_id: UUID, now: datetime) -> dict[str, Any] | None:
        return await self._update_user(user_id, removed_at=now, sessions_not_before=now)

    async def live_keys_created_by(self, account_id: UUID, user_id: UUID) -> list[dict[str, Any]]:
        return [self._key(k) for k in self._live(account_id) if k["created_by"] == user_id]

    async def restamp_keys_created_by(self, account_id: UUID, user_id: UUID) -> list[dict[str, Any]]:
        return [self._update_key(k["id"]) for k in self._live(account_id) if k["created_by"] == user_id]

    # ---- API keys
    @staticmethod
    def _key(row: dict[str, Any]) -> dict[str, Any]:
        return {c: row[c] for c in _KEY_COLUMNS}

    def _live(self, account_id: UUID) -> list[dict[str, Any]]:
        rows = [k for k in self.keys.values() if k["account_id"] == account_id and k["deleted_at"] is None]
        return sorted(rows, key=lambda k: (k["created_at"], str(k["id"])))

    async def insert_key(
        self,
        *,
        key_id: UUID,
        account_id: UUID,
        name: str,
        digest: str,
        masked_key: str,
        status: str,
        expires_at: datetime | None,
        created_at: datetime,
        created_by: UUID,
        rules: dict[str, Any] | None = None,
        lineage_id: UUID | None = None,
    ) -> dict[str, Any]:
        self.keys[key_id] = {
            "rules": copy.deepcopy(rules or {}),  # JSON, as the jsonb column returns it
            "lineage_id": lineage_id or key_id,
            "created_by": created_by,
            "id": key_id,
            "account_id": account_id,
            "name": name,
            "hash": digest,
            "masked_key": masked_key,
            "status": status,
            "expires_at": expires_at,
            "delete_at": None,
            "deleted_at": None,
            "created_at": created_at,
            "last_used_at": None,
            "version": 1,
        }
        return self._key(self.keys[key_id])

    async def key_for_update(self, account_id: UUID, key_id: UUID) -> dict[str, Any] | None:
        row = self.keys.get(key_id)
        if row is None or row["account_id"] != account_id or row["deleted_at"] is not None:
            return None
        return self._key(row)

    async def list_keys(self, account_id: UUID) -> list[dict[str, Any]]:
        return [self._key(k) for k in self._live(account_id)]

    async def live_keys_of(self, account_id: UUID) -> list[dict[str, Any]]:
        return [self._key(k) for k in self._live(account_id)]

    def _update_key(self, key_id: UUID, **values: Any) -> dict[str, Any]:
        """A write of the key's published state: its version moves on."""
        row = self.keys[key_id]
        row.update(values, version=row["version"] + 1)
        return self._key(row)

    async def set_status(self, key_id: UUID, status: str) -> dict[str, Any]:
        return self._update_key(key_id, status=status)

    async def set_expiry(self, key_id: UUID, expires_at: datetime, delete_at: datetime | None) -> dict[str, Any]:
        return self._update_key(key_id, expires_at=expires_at, delete_at=delete_at)

    async def set_rules(self, key_id: UUID, name: str, rules: dict[str, Any]) -> dict[str, Any]:
        return self._update_key(key_id, name=name, rules=copy.deepcopy(rules))

    async def mark_deleted(self, key_id: UUID, now: datetime) -> dict[str, Any]:
        return self._update_key(key_id, deleted_at=now)

    async def due_for_deletion(self, now: datetime, limit: int = 200) -> list[dict[str, Any]]:
        due = [k for k in self.keys.values() if k["deleted_at"] is None and k["delete_at"] is not None and k["delete_at"] <= now]
        return [self._key(k) for k in sorted(due, key=lambda k: k["delete_at"])[:limit]]

    async def touch_last_used(self, used: dict[UUID, datetime]) -> None:
        for key_id, at in used.items():
            row = self.keys.get(key_id)
            if row is not None and (row["last_used_at"] is None or row["last_used_at"] < at):
                row["last_used_at"] = at

    # ---- service tokens
    async def insert_service_token(
        self, *, token_id: UUID, name: str, digest: str, scopes: list[str], created_at: datetime
    ) -> dict[str, Any]:
        self.tokens[token_id] = {
            "id": token_id,
            "name": name,
            "hash": digest,
            "scopes": list(scopes),
            "created_at": created_at,
            "last_used_at": None,
            "revoked_at": None,
            "version": 1,
        }
        return dict(self.tokens[token_id])

    async def list_service_tokens(self) -> list[dict[str, Any]]:
        return [dict(t) for t in sorted(self.tokens.values(), key=lambda t: (t["created_at"], str(t["id"])))]

    async def service_token_is_live(self, token_id: UUID) -> bool:
        row = self.tokens.get(token_id)
        return row is not None and row["revoked_at"] is None

    async def revoke_service_token(self, token_id: UUID, now: datetime) -> dict[str, Any] | None:
        row = self.tokens.get(token_id)
        if row is None:
            return None
        row.update(revoked_at=row["revoked_at"] or now, version=row["version"] + 1)
        return dict(row)

    async def touch_service_tokens(self, used: dict[UUID, datetime]) -> None:
        for token_id, at in used.items():
            row = self.tokens.get(token_id)
            if row is not None and (row["last_used_at"] is None or row["last_used_at"] < at):
                row["last_used_at"] = at

    # ---- logged-out sessions, republishing
    async def insert_session_revocation(self, account_id: UUID, user_id: UUID, session_id: str, revoked_at: datetime) -> None:
        self.logouts.setdefault(
            (user_id, session_id),
            {"user_id": user_id, "session_id": session_id, "account_id": account_id, "revoked_at": revoked_at},
        )

    async def all_accounts(self) -> list[dict[str, Any]]:
        return [dict(self.accounts[a]) for a in sorted(self.accounts)]

    async def all_users(self) -> list[dict[str, Any]]:
        return [dict(self.users[u]) for u in sorted(self.users)]

    async def all_live_keys(self) -> list[dict[str, Any]]:
        live = [k for k in self.keys.values() if k["deleted_at"] is None]
        rows = []
        for k in sorted(live, key=lambda k: k["id"]):
            creator = self.users.get(k["created_by"] or k["account_id"])
            rows.append({**self._key(k), "creator_role": None if creator is None else creator["role"]})
        return rows

    async def raise_versions(self, topic: str, kafka_versions: Mapping[UUID, int]) -> set[UUID]:
        table = {"accounts.v1": self.accounts, "users.v1": self.users, "keys.v1": self.keys, "service-tokens.v1": self.tokens}
        raised = set()
        for object_id, version in kafka_versions.items():
            row = table[topic].get(object_id)
            if row is not None and row["version"] < version:
                row["version"] = version + 1
                raised.add(object_id)
        return raised

    async def keep_sessions_ended(self, ended: Mapping[UUID, datetime]) -> None:
        for user_id, instant in ended.items():
            row = self.users.get(user_id)
            if row is not None and (row["sessions_not_before"] is None or row["sessions_not_before"] < instant):
                row.update(sessions_not_before=instant, version=row["version"] + 1)

    async def live_service_tokens(self) -> list[dict[str, Any]]:
        return [dict(self.tokens[t]) for t in sorted(self.tokens) if self.tokens[t]["revoked_at"] is None]

    async def session_revocations_since(self, since: datetime) -> list[dict[str, Any]]:
        return sorted((dict(r) for r in self.logouts.values() if r["revoked_at"] > since), key=lambda r: r["revoked_at"])

    async def state_counts(self, sessions_since: datetime) -> dict[str, int]:
        return {
            "keys.v1": sum(1 for k in await self.all_live_keys() if k["creator_role"] is not None),
            "accounts.v1": len(self.accounts),
            "users.v1": len(self.users),
            "service-tokens.v1": sum(1 for t in self.tokens.values() if t["revoked_at"] is None),
            "sessions.v1": len(await self.session_revocations_since(sessions_since)),
        }

    # ---- the audit log
    async def insert_audit_entry(self, event: AuditRecorded) -> bool:
        if event.id in self.audit_log:
            return False
        user = self.users.get(event.actor.user_id) if event.actor.user_id is not None else None
        self.audit_log[event.id] = {
            "id": event.id,
            "account_id": event.account_id,
            "time": event.time,
            "actor_user_id": event.actor.user_id,
            "actor_email": user["email"] if user is not None else None,
            "actor_api_key_id": event.actor.api_key_id,
            "actor_operator": event.actor.operator,
            "action": event.action.value,
            "target_type": event.target.type,
            "target_id": event.target.id,
            "ip": event.ip,
            "user_agent": event.user_agent,
            "details": copy.deepcopy(event.details),
        }
        return True

    async def audit_entries(
        self,
        account_id: UUID,
        *,
        start: datetime | None,
        end: datetime | None,
        action: str | None,
        before: tuple[datetime, UUID] | None,
        limit: int,
    ) -> list[dict[str, Any]]:
        rows = [
            r
            for r in self.audit_log.values()
            if r["account_id"] == account_id
            and (start is None or r["time"] >= start)
            and (end is None or r["time"] < end)
            and (action is None or r["action"] == action)
            and (before is None or (r["time"], str(r["id"])) < (before[0], str(before[1])))
        ]
        rows.sort(key=lambda r: (r["time"], str(r["id"])), reverse=True)
        return [dict(r) for r in rows[:limit]]


class FakeLocalEdge:
    """services/keys/service.py's LocalEdge: records what was delivered, issues readable sessions."""

    def __init__(self) -> None:
        self.delivered: list[Any] = []  # the Changes of each delivery, in order
        self.accounts: set[UUID] = set()
        self.uses: dict[UUID, datetime] = {}
        self.plans: dict[UUID, PlanChanged] = {}  # the edge's plan projection (billing applies payments there)

    async def deliver(self, changes: Any) -> None:
        self.delivered.append(changes)
        self.accounts.update(a.account_id for a in changes.accounts)

    def knows_account(self, account_id: UUID) -> bool:
        return account_id in self.accounts

    def latest_plan(self, account_id: UUID) -> PlanChanged | None:
        return self.plans.get(account_id)

    def issue_session(self, account_id: UUID, session_id: str, now: datetime, user_id: UUID) -> str:
        return f"tg1.{account_id}.{user_id}.{session_id}"

    def drain_service_token_uses(self) -> dict[UUID, datetime]:
        used, self.uses = self.uses, {}
        return used

    def note_service_token_use(self, token_id: UUID, at: datetime) -> None:
        if token_id not in self.uses or self.uses[token_id] < at:
            self.uses[token_id] = at


class BillingWorld:
    """Billing's use cases on fakes, the clock at `now`: the store, outbox, accounts, provider and
    edge a test reads back, and the service over them."""

    def __init__(self, now: datetime, tz: tzinfo) -> None:
        self.store = FakeBillingStore()
        self.outbox = FakeOutbox()
        self.accounts = FakeAccounts()
        self.provider = FakePaymentProvider()
        self.clock = FakeClock(now)
        self.edge = FakeBillingEdge()
        self.service = BillingService(self.store, self.outbox, self.accounts, self.provider, self.clock, tz, edge=self.edge)
        self.account = uuid.uuid4()


# ---- keys: the throttles' shared logs ----
class FakeSharedLogs:
    """The throttles' Redis (services/keys/redis_logs.py) without Redis: one set of logs that every
    "replica" holding it shares, on one clock. `down`: every call raises, as a refused connection;
    `hung`: every call waits for ever, as a Redis that stopped answering. `calls` counts the asks."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.logs = LocalLogs(clock=clock)
        self.down = False
        self.hung = False
        self.calls = 0

    async def _answer(self) -> None:
        self.calls += 1
        if self.hung:
            await asyncio.Event().wait()
        if self.down:
            raise ConnectionError("redis: connection refused")

    async def count(self, entries: Sequence[Entry]) -> Counted:
        await self._answer()
        return replace(await self.logs.count(entries), shared=True)

    async def forgive(self, entries: Sequence[Entry], counted: Counted) -> None:
        await self._answer()
        await self.logs.forgive(entries, counted)

    async def clear(self, entries: Sequence[Entry]) -> None:
        await self._answer()
        await self.logs.clear(entries)

    async def close(self) -> None:
        return None


# ---- the edge's shared ends (services/edge/user_revocations.py, token_revocations.py) -----------
class FakeSessionEnds:
    """The session check of user_revocations.UserRevocations: what the shared store says of each
    (user, session), the questions asked, and an outage at will."""

    def __init__(self) -> None:
        self.over: dict[tuple[UUID, str], str] = {}  # (user id, session id) -> why it is over
        self.asked: list[tuple[UUID, str, int, float]] = []
        self.failing = False

    async def session_over(self, user_id: UUID, session_id: str, user_version: int, issued_at: float) -> str | None:
        self.asked.append((user_id, session_id, user_version, issued_at))
        if self.failing:
            raise ConnectionError("redis is away")
        return self.over.get((user_id, session_id))


class FakeExistsRedis:
    """The one Redis command token_revocations.TokenRevocations asks (`exists`), counted; an outage at will."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.asked = 0
        self.failing = False

    async def exists(self, name: str) -> int:
        self.asked += 1
        if self.failing:
            raise ConnectionError("redis is away")
        return int(name in self.names)

    async def set(self, name: str, value: bytes, ex: int) -> None:
        self.names.add(name)
