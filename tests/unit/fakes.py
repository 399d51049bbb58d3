"""Fakes of the ports the use cases take (cosmicpython's fakes): no I/O, so the unit suite runs
every use case in milliseconds. One section per service; the shared ones first."""

from datetime import UTC, datetime, timedelta


class FakeClock:
    """A Clock (contracts/clock.py) that stands still until told to move."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now or datetime(2026, 11, 15, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


# ---- billing ----
import copy  # noqa: E402
from collections.abc import AsyncIterator  # noqa: E402
from contextlib import asynccontextmanager  # noqa: E402
from decimal import Decimal  # noqa: E402
from typing import Any  # noqa: E402
from uuid import UUID  # noqa: E402

from contracts.common import Tier, UserType  # noqa: E402
from contracts.events import AccountState  # noqa: E402
from contracts.topics import Topic  # noqa: E402
from services.billing.domain import Idempotency, KeyReused  # noqa: E402
from services.billing.payments import Charge  # noqa: E402
from services.billing.store import AccountRow, InvoiceRow, OrderRow  # noqa: E402


class FakeOutbox:
    """The outbox relay's port: `events` holds (topic name, key, value) of every row added;
    `flushes` and `wakes` count the publications asked for."""

    def __init__(self) -> None:
        self.events: list[tuple[str, bytes, bytes | None]] = []
        self.flushes = 0
        self.wakes = 0

    async def add(self, conn: Any, topic: Topic, key: bytes, value: bytes | None) -> int:
        self.events.append((topic.name, key, value))
        return len(self.events)

    async def flush(self) -> int:
        self.flushes += 1
        return 0

    def wake(self) -> None:
        self.wakes += 1


class FakeBillingState:
    def __init__(self) -> None:
        self.accounts: dict[UUID, AccountRow] = {}
        self.orders: dict[UUID, OrderRow] = {}
        self.keys: dict[tuple[UUID, str, str], tuple[str, dict[str, Any] | None]] = {}
        self.invoices: dict[UUID, InvoiceRow] = {}
        self.counters: dict[str, int] = {}


class FakeBillingTx:
    """store.BillingTx in memory, on a copy of the state that is kept only if the block succeeds."""

    conn = None

    def __init__(self, state: FakeBillingState) -> None:
        self.state = state

    async def lock_account(self, account_id: UUID, default_user_type: UserType, default_time: datetime | None) -> AccountRow:
        return self.state.accounts.setdefault(account_id, AccountRow(account_id, Tier.FREE, default_user_type, default_time))

    async def set_user_type(self, account_id: UUID, user_type: UserType, time: datetime) -> None:
        row = self.state.accounts.get(account_id)
        if row is None:
            self.state.accounts[account_id] = AccountRow(account_id, Tier.FREE, user_type, time)
        elif row.user_type_time is None or row.user_type_time < time:
            self.state.accounts[account_id] = AccountRow(account_id, row.plan, user_type, time)

    async def set_plan(self, account_id: UUID, plan: Tier, now: datetime) -> None:
        row = self.state.accounts[account_id]
        self.state.accounts[account_id] = AccountRow(account_id, plan, row.user_type, row.user_type_time)

    async def insert_order(self, order: OrderRow) -> None:
        self.state.orders[order.id] = order

    async def lock_order(self, order_id: UUID, account_id: UUID) -> OrderRow | None:
        order = self.state.orders.get(order_id)
        return order if order is not None and order.account_id == account_id else None

    async def mark_paid(self, order_id: UUID, now: datetime, reference: str) -> None:
        order = self.state.orders[order_id]
        self.state.orders[order_id] = OrderRow(**{**order.__dict__, "status": "paid", "paid_at": now})

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
    """A payment provider, idempotent on the order id like a real one; counts every attempt."""

    def __init__(self) -> None:
        self.attempts = 0
        self.charges: dict[UUID, tuple[Decimal, str]] = {}

    async def charge(self, order_id: UUID, account_id: UUID, amount: Decimal, currency: str) -> Charge:
        self.attempts += 1
        self.charges.setdefault(order_id, (amount, currency))
        return Charge(reference=f"fake-{order_id}")


class FakeAccounts:
    """The edge's accounts.v1 projection: what it knows of each account's user type."""

    def __init__(self) -> None:
        self.states: dict[UUID, AccountState] = {}

    def get(self, account_id: UUID) -> AccountState | None:
        return self.states.get(account_id)


# ---- geo ----
from contracts.common import Resource  # noqa: E402
from services.geo.store import ProjectRow  # noqa: E402


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
