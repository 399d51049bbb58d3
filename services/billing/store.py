"""Billing's Postgres adapter (schema `billing`); functions run inside the caller's transaction."""

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection

from contracts.common import Resource, Tier, UserType

Conn = AsyncConnection[Any]  # dict rows (see services/runtime/platform/postgres.py)


@dataclass(frozen=True)
class AccountRow:
    account_id: UUID
    plan: Tier
    user_type: UserType
    user_type_time: datetime | None


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


async def lock_account(conn: Conn, account_id: UUID, default_user_type: UserType, default_time: datetime | None) -> AccountRow:
    """The account's subscription row, created on first use (free tier) and locked FOR UPDATE:
    plan and user-type changes of one account happen one after the other."""
    await conn.execute(
        "INSERT INTO billing.accounts (account_id, user_type, user_type_time) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
        (account_id, default_user_type.value, default_time),
    )
    cur = await conn.execute("SELECT * FROM billing.accounts WHERE account_id = %s FOR UPDATE", (account_id,))
    row = await cur.fetchone()
    assert row is not None
    return AccountRow(row["account_id"], Tier(row["plan"]), UserType(row["user_type"]), row["user_type_time"])


async def set_user_type(conn: Conn, account_id: UUID, user_type: UserType, time: datetime) -> None:
    """Apply a user-type fact unless a later one is already in place (events may come reordered)."""
    await conn.execute(
        """
        INSERT INTO billing.accounts (account_id, user_type, user_type_time) VALUES (%s, %s, %s)
        ON CONFLICT (account_id) DO UPDATE SET user_type = EXCLUDED.user_type, user_type_time = EXCLUDED.user_type_time
         WHERE billing.accounts.user_type_time IS NULL OR billing.accounts.user_type_time < EXCLUDED.user_type_time
        """,
        (account_id, user_type.value, time),
    )


async def set_plan(conn: Conn, account_id: UUID, plan: Tier, now: datetime) -> None:
    await conn.execute(
        "UPDATE billing.accounts SET plan = %s, plan_changed_at = %s WHERE account_id = %s", (plan.value, now, account_id)
    )


async def insert_order(conn: Conn, order: OrderRow) -> None:
    await conn.execute(
        """
        INSERT INTO billing.orders (id, account_id, kind, status, amount, currency, plan, previous_plan, resource,
                                    quantity, period, created_at, paid_at)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
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
        ),
    )


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
    )


async def lock_order(conn: Conn, order_id: UUID, account_id: UUID) -> OrderRow | None:
    cur = await conn.execute("SELECT * FROM billing.orders WHERE id = %s AND account_id = %s FOR UPDATE", (order_id, account_id))
    row = await cur.fetchone()
    return _order(row) if row else None


async def mark_paid(conn: Conn, order_id: UUID, now: datetime, reference: str) -> None:
    await conn.execute(
        "UPDATE billing.orders SET status = 'paid', paid_at = %s, payment_reference = %s WHERE id = %s",
        (now, reference, order_id),
    )
