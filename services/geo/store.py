"""Postgres adapter of the geo service (schema `geo`)."""

from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import DictRow

Conn = AsyncConnection[DictRow]
Row = dict[str, Any]


async def list_projects(conn: Conn, account_id: UUID) -> list[Row]:
    cur = await conn.execute(
        "SELECT id, name, created_at FROM geo.projects WHERE account_id = %s ORDER BY created_at, id", (account_id,)
    )
    return await cur.fetchall()


async def insert_project(conn: Conn, project_id: UUID, account_id: UUID, name: str, now: datetime) -> Row:
    cur = await conn.execute(
        "INSERT INTO geo.projects (id, account_id, name, created_at) VALUES (%s, %s, %s, %s) RETURNING id, name, created_at",
        (project_id, account_id, name, now),
    )
    row = await cur.fetchone()
    assert row is not None
    return row


async def delete_project(conn: Conn, account_id: UUID, project_id: UUID) -> bool:
    """True if this account's project existed (another account's answers like a missing one)."""
    cur = await conn.execute("DELETE FROM geo.projects WHERE id = %s AND account_id = %s", (project_id, account_id))
    return cur.rowcount == 1


async def lock_account(conn: Conn, account_id: UUID) -> None:
    """Serialise this account's project creations until the transaction ends, on every replica
    (a transaction-scoped advisory lock on a 64-bit digest of the account id: no row needed)."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"geo.projects:{account_id}",))


async def count_projects(conn: Conn, account_id: UUID) -> int:
    cur = await conn.execute("SELECT count(*) AS n FROM geo.projects WHERE account_id = %s", (account_id,))
    row = await cur.fetchone()
    assert row is not None
    return int(row["n"])
