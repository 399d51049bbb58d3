"""Billing's Postgres adapter (schema `billing`): all its SQL. `BillingStore.transaction()` yields a
BillingTx whose methods run inside that one transaction."""

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from contracts.common import Resource, Tier, UserType
from services.billing.domain import Idempotency, KeyReused

Conn = AsyncConnection[Any]  # dict rows (see services/runtime/platform/postgres.py)


@dataclass(frozen=True)
class AccountRow:
    account_id: UUID
    plan: Tier
    user_type: UserType
    user_type_time: datetime | None
    user_type_version: int = 0  # with user_type_time: the order of the fact (contracts/events.py, order_of)
    deleted_at: datetime | None = None  # accounts.v1 holds the account deleted (migration 0007): never renewed


@dataclass(frozen=True)
class OrderRow:
    id: UUID
    account_id: UUID
    kind: str
    status: str
    amount: Decimal
    currency: str
    plan: Tier | None
    previous_plan: Tier | None
    resource: Resource | None
    quantity: int | None
    period: str
    created_at: datetime
    paid_at: datetime | None
    # plan_renewal only: failed charge attempts, when the job tries again, when the grace ended unpaid,
    # when it was declined with no grace earned and the account put on free at once (migration 0008)
    attempts: int = 0
    next_attempt_at: datetime | None = None
    lapsed_at: datetime | None = None
    plan_dropped_at: datetime | None = None


@dataclass(frozen=True)
class InvoiceRow:
    order_id: UUID
    seller: str
    number: int
    issued_at: datetime
    buyer: dict[str, Any]


@dataclass(frozen=True)
class PlanRow:
    """An account's current plan, as its last plan_changed said it."""

    account_id: UUID
    plan: Tier
    changed_at: datetime
    version: int


class BillingTx:
    """Billing's statements inside one transaction (the account row lock lives as long as it)."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    async def lock_account(
        self, account_id: UUID, default_user_type: UserType, default_time: datetime | None, default_version: int
    ) -> AccountRow:
        """The account's subscription row, created on first use (free tier) and locked FOR UPDATE:
        plan and user-type changes of one account happen one after the other."""
        await self.conn.execute(
            """INSERT INTO billing.accounts (account_id, user_type, user_type_time, user_type_version)
               VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING""",
            (account_id, default_user_type.value, default_time, default_version),
        )
        cur = await self.conn.execute("SELECT * FROM billing.accounts WHERE account_id = %s FOR UPDATE", (account_id,))
        row = await cur.fetchone()
        assert row is not None
        return AccountRow(
            row["account_id"],
            Tier(row["plan"]),
            UserType(row["user_type"]),
            row["user_type_time"],
            row["user_type_version"],
            row["deleted_at"],
        )

    async def set_user_type(self, account_id: UUID, user_type: UserType, time: datetime, version: int) -> None:
        """Apply a user-type fact unless a later one is already in place (events may come reordered,
        and their times from clocks that disagree: the keys service's version orders them first)."""
        await self.conn.execute(
            """
            INSERT INTO billing.accounts AS a (account_id, user_type, user_type_time, user_type_version) VALUES (%s, %s, %s, %s)
            ON CONFLICT (account_id) DO UPDATE
               SET user_type = EXCLUDED.user_type, user_type_time = EXCLUDED.user_type_time,
                   user_type_version = EXCLUDED.user_type_version
             WHERE a.user_type_time IS NULL
                OR (a.user_type_version, a.user_type_time) < (EXCLUDED.user_type_version, EXCLUDED.user_type_time)
            """,
            (account_id, user_type.value, time, version),
        )

    async def mark_account_deleted(self, account_id: UUID, user_type: UserType, time: datetime) -> None:
        """The account ended (accounts.v1 holds it deleted); the first time billing heard it is kept."""
        await self.conn.execute(
            """
            INSERT INTO billing.accounts AS a (account_id, user_type, deleted_at) VALUES (%s, %s, %s)
            ON CONFLICT (account_id) DO UPDATE SET deleted_at = coalesce(a.deleted_at, EXCLUDED.deleted_at)
            """,
            (account_id, user_type.value, time),
        )

    async def lock_user_type(self, account_id: UUID) -> UserType | None:
        """The user type of record (keys'), its keys row locked until this transaction ends: a
        user-type change waits for this plan decision, and this one for it (keys migration
        0011_plan_hold.sql). None: the keys service holds no such account."""
        cur = await self.conn.execute("SELECT keys.lock_user_type(%s) AS user_type", (account_id,))
        row = await cur.fetchone()
        return UserType(row["user_type"]) if row and row["user_type"] is not None else None

    async def record_plan(self, account_id: UUID, plan: Tier, time: datetime, version: int) -> None:
        """The plan put in force, in keys' row before its lock is let go: the user-type change
        waiting on it judges by this plan, not by keys' billing.v1 consumer's older copy."""
        await self.conn.execute("SELECT keys.record_plan(%s, %s, %s, %s)", (account_id, plan.value, time, version))

    async def set_plan(self, account_id: UUID, plan: Tier, now: datetime, period: str) -> int:
        """The new plan, at the account's next plan version (the caller holds its row lock). The
        first change in `period` keeps the plan held at its start (the renewal's plan)."""
        cur = await self.conn.execute(
            """UPDATE billing.accounts SET plan = %s, plan_changed_at = %s, plan_version = plan_version + 1,
                      start_plan = CASE WHEN start_plan_period IS DISTINCT FROM %s THEN plan ELSE start_plan END,
                      start_plan_period = %s
               WHERE account_id = %s RETURNING plan_version""",
            (plan.value, now, period, period, account_id),
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row["plan_version"])

    async def insert_order(self, order: OrderRow) -> None:
        await self.conn.execute(
            """
            INSERT INTO billing.orders (id, account_id, kind, status, amount, currency, plan, previous_plan, resource,
                                        quantity, period, created_at, paid_at, next_attempt_at)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            """,
            (
                order.id,
                order.account_id,
                order.kind,
                order.status,
                order.amount,
                order.currency,
                order.plan.value if order.plan else None,
                order.previous_plan.value if order.previous_plan else None,
                order.resource.value if order.resource else None,
                order.quantity,
                order.period,
                order.created_at,
                order.paid_at,
                order.next_attempt_at,
            ),
        )

    @staticmethod
    def _order(row: dict[str, Any]) -> OrderRow:
        return OrderRow(
            id=row["id"],
            account_id=row["account_id"],
            kind=row["kind"],
            status=row["status"],
            amount=row["amount"],
            currency=row["currency"],
            plan=Tier(row["plan"]) if row["plan"] else None,
            previous_plan=Tier(row["previous_plan"]) if row["previous_plan"] else None,
            resource=Resource(row["resource"]) if row["resource"] else None,
            quantity=row["quantity"],
            period=row["period"],
            created_at=row["created_at"],
            paid_at=row["paid_at"],
            attempts=row["attempts"],
            next_attempt_at=row["next_attempt_at"],
            lapsed_at=row["lapsed_at"],
            plan_dropped_at=row["plan_dropped_at"],
        )

    async def lock_order(self, order_id: UUID, account_id: UUID) -> OrderRow | None:
        cur = await self.conn.execute(
            "SELECT * FROM billing.orders WHERE id = %s AND account_id = %s FOR UPDATE", (order_id, account_id)
        )
        row = await cur.fetchone()
        return self._order(row) if row else None

    async def mark_paid(self, order_id: UUID, now: datetime, reference: str) -> None:
        await self.conn.execute(
            """UPDATE billing.orders SET status = 'paid', paid_at = %s, payment_reference = %s, next_attempt_at = NULL
               WHERE id = %s""",
            (now, reference, order_id),
        )

    # ---- (v2) the order history and invoices ------------------------------------------------------
    async def list_orders(self, account_id: UUID, limit: int, before: tuple[datetime, UUID] | None) -> list[OrderRow]:
        """Newest first, by keyset: the orders strictly before `before` (created_at, id)."""
        if before is None:
            cur = await self.conn.execute(
                "SELECT * FROM billing.orders WHERE account_id = %s ORDER BY created_at DESC, id DESC LIMIT %s",
                (account_id, limit),
            )
        else:
            cur = await self.conn.execute(
                """
                SELECT * FROM billing.orders WHERE account_id = %s AND (created_at, id) < (%s, %s)
                 ORDER BY created_at DESC, id DESC LIMIT %s
                """,
                (account_id, before[0], before[1], limit),
            )
        return [self._order(row) for row in await cur.fetchall()]

    async def get_order(self, order_id: UUID, account_id: UUID) -> OrderRow | None:
        cur = await self.conn.execute("SELECT * FROM billing.orders WHERE id = %s AND account_id = %s", (order_id, account_id))
        row = await cur.fetchone()
        return self._order(row) if row else None

    async def take_invoice_number(self, seller: str) -> int:
        """The seller's next number, from its counter row locked until this transaction ends: a
        rolled-back payment gives its number back, so the numbers have no gap."""
        cur = await self.conn.execute(
            """
            INSERT INTO billing.invoice_counters AS c (seller, last_number) VALUES (%s, 1)
            ON CONFLICT (seller) DO UPDATE SET last_number = c.last_number + 1 RETURNING last_number
            """,
            (seller,),
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row["last_number"])

    async def insert_invoice(self, invoice: InvoiceRow) -> None:
        await self.conn.execute(
            "INSERT INTO billing.invoices (order_id, seller, number, issued_at, buyer) VALUES (%s, %s, %s, %s, %s::jsonb)",
            (invoice.order_id, invoice.seller, invoice.number, invoice.issued_at, json.dumps(invoice.buyer)),
        )

    async def get_invoice(self, order_id: UUID) -> InvoiceRow | None:
        cur = await self.conn.execute(
            "SELECT order_id, seller, number, issued_at, buyer FROM billing.invoices WHERE order_id = %s", (order_id,)
        )
        row = await cur.fetchone()
        return InvoiceRow(row["order_id"], row["seller"], row["number"], row["issued_at"], row["buyer"]) if row else None

    # ---- Idempotency-Key rows (domain.Idempotency) ----------------------------------------------
    async def claim_key(self, account_id: UUID, request: Idempotency) -> dict[str, Any] | None:
        """The stored response of an earlier request with this key (None: this request runs, and
        `remember_key` must be called in the same transaction). KeyReused if the key was used for
        another request. The row is inserted before anything else in the use case's transaction:
        a concurrent retry waits on the unique key until the first commits (then replays it) or
        rolls back (then runs itself)."""
        cur = await self.conn.execute(
            """
            SELECT fingerprint, status, response FROM billing.idempotency_keys
             WHERE account_id = %s AND route = %s AND key = %s FOR UPDATE
            """,
            (account_id, request.route, request.key),
        )
        row = await cur.fetchone()
        if row is None:
            # Take the key now: a concurrent request with it blocks here until this transaction ends.
            cur = await self.conn.execute(
                """
                INSERT INTO billing.idempotency_keys (account_id, route, key, fingerprint, status, response)
                VALUES (%s, %s, %s, %s, 0, 'null'::jsonb)
                ON CONFLICT (account_id, route, key) DO NOTHING RETURNING id
                """,
                (account_id, request.route, request.key, request.fingerprint),
            )
            if await cur.fetchone() is not None:
                return None
            return await self.claim_key(account_id, request)  # a concurrent request committed it meanwhile
        if row["fingerprint"] != request.fingerprint:
            raise KeyReused()
        if row["status"] == 0:  # never committed without a response; defensive: run the request
            return None
        response: dict[str, Any] = row["response"]
        return response

    async def remember_key(self, account_id: UUID, request: Idempotency, status: int, response: dict[str, Any]) -> None:
        await self.conn.execute(
            """
            UPDATE billing.idempotency_keys SET status = %s, response = %s::jsonb
             WHERE account_id = %s AND route = %s AND key = %s
            """,
            (status, json.dumps(response), account_id, request.route, request.key),
        )

    # ---- renewals (docs/api.md, "Renewals") -----------------------------------------------------
    async def renewal_candidates(self, period: str) -> list[UUID]:
        """Accounts that may owe `period`'s renewal: off free at some time, not deleted, none made
        for it yet (`start_plan` decides, under the account's lock)."""
        cur = await self.conn.execute(
            """
            SELECT a.account_id FROM billing.accounts a
             WHERE a.plan_changed_at IS NOT NULL AND a.deleted_at IS NULL
               AND (a.plan <> 'free' OR (a.start_plan_period = %s AND a.start_plan <> 'free'))
               AND NOT EXISTS (SELECT 1 FROM billing.orders o
                                WHERE o.account_id = a.account_id AND o.kind = 'plan_renewal' AND o.period = %s)
             ORDER BY a.account_id
            """,
            (period, period),
        )
        return [row["account_id"] for row in await cur.fetchall()]

    async def start_plan(self, account_id: UUID, period: str, start: datetime) -> Tier | None:
        """The plan the account held at `start` of `period` (None: unknown, its plan changed in the
        period before start plans were recorded). The caller holds the account's row lock."""
        cur = await self.conn.execute(
            "SELECT plan, plan_changed_at, start_plan, start_plan_period FROM billing.accounts WHERE account_id = %s",
            (account_id,),
        )
        row = await cur.fetchone()
        if row is None:
            return None
        if row["start_plan_period"] == period:
            return Tier(row["start_plan"])
        if row["plan_changed_at"] is None or row["plan_changed_at"] < start:
            return Tier(row["plan"])
        return None

    async def insert_renewal(self, order: OrderRow) -> bool:
        """The period's renewal, unless one exists already (another replica's): True if inserted."""
        cur = await self.conn.execute(
            """
            INSERT INTO billing.orders (id, account_id, kind, status, amount, currency, plan, period, created_at,
                                        next_attempt_at)
            VALUES (%s, %s, 'plan_renewal', 'pending', %s, %s, %s, %s, %s, %s)
            ON CONFLICT (account_id, period) WHERE kind = 'plan_renewal' DO NOTHING RETURNING id
            """,
            (
                order.id,
                order.account_id,
                order.amount,
                order.currency,
                order.plan.value if order.plan else None,
                order.period,
                order.created_at,
                order.next_attempt_at,
            ),
        )
        return await cur.fetchone() is not None

    async def due_renewals(self, now: datetime) -> list[tuple[UUID, UUID]]:
        """(order id, account id) of the pending renewals whose next attempt is due, oldest first."""
        cur = await self.conn.execute(
            """
            SELECT id, account_id FROM billing.orders
             WHERE kind = 'plan_renewal' AND status = 'pending' AND lapsed_at IS NULL AND next_attempt_at <= %s
             ORDER BY next_attempt_at, id
            """,
            (now,),
        )
        return [(row["id"], row["account_id"]) for row in await cur.fetchall()]

    async def record_attempt(self, order_id: UUID, next_attempt_at: datetime) -> None:
        """A failed charge of a renewal: counted, and the next one scheduled."""
        await self.conn.execute(
            "UPDATE billing.orders SET attempts = attempts + 1, next_attempt_at = %s WHERE id = %s",
            (next_attempt_at, order_id),
        )

    async def paid_renewal_plan(self, account_id: UUID, period: str) -> Tier | None:
        """The plan of the account's renewal of `period` if it was paid (None: none, or unpaid)."""
        cur = await self.conn.execute(
            """SELECT plan FROM billing.orders
               WHERE account_id = %s AND kind = 'plan_renewal' AND period = %s AND status = 'paid'""",
            (account_id, period),
        )
        row = await cur.fetchone()
        return Tier(row["plan"]) if row else None

    async def drop_renewal(self, order_id: UUID, now: datetime) -> None:
        """A renewal declined with no grace earned: counted, never tried again by the job, and marked
        as the one whose payment puts the plan back (it stays pending: the customer may pay it)."""
        await self.conn.execute(
            """UPDATE billing.orders SET attempts = attempts + 1, next_attempt_at = NULL, plan_dropped_at = %s
               WHERE id = %s""",
            (now, order_id),
        )

    async def lapse_renewals(self, account_id: UUID, now: datetime) -> None:
        """Every pending renewal of the account ends unpaid: none is charged again."""
        await self.conn.execute(
            """UPDATE billing.orders SET attempts = attempts + 1, lapsed_at = %s, next_attempt_at = NULL
               WHERE account_id = %s AND kind = 'plan_renewal' AND status = 'pending' AND lapsed_at IS NULL""",
            (now, account_id),
        )

    # ---- republishing (docs/architecture.md, "Kafka is transport") ------------------------------
    async def current_plans(self) -> list[PlanRow]:
        """Every account that ever changed plan, on its current plan (the others are on free)."""
        cur = await self.conn.execute(
            """SELECT account_id, plan, plan_changed_at, plan_version FROM billing.accounts
               WHERE plan_changed_at IS NOT NULL ORDER BY account_id"""
        )
        return [PlanRow(r["account_id"], Tier(r["plan"]), r["plan_changed_at"], r["plan_version"]) for r in await cur.fetchall()]

    async def paid_packages(self, period: str) -> list[OrderRow]:
        """The quota packages paid for `period` (they add to its totals)."""
        cur = await self.conn.execute(
            """SELECT * FROM billing.orders WHERE kind = 'quota_package' AND status = 'paid' AND period = %s
               ORDER BY paid_at, id""",
            (period,),
        )
        return [self._order(r) for r in await cur.fetchall()]

    async def count_facts(self, period: str) -> int:
        """How many billing.v1 facts republishing would emit (accounts off free, packages of `period`)."""
        cur = await self.conn.execute(
            """SELECT (SELECT count(*) FROM billing.accounts WHERE plan_changed_at IS NOT NULL)
                    + (SELECT count(*) FROM billing.orders WHERE kind = 'quota_package' AND status = 'paid' AND period = %s)
                      AS n""",
            (period,),
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row["n"])


class BillingStore:
    """Opens billing's transactions; everything else happens on the BillingTx it yields."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[BillingTx]:
        async with self._pool.connection() as conn, conn.transaction():
            yield BillingTx(conn)
