"""Postgres adapter of the geo service (schema `geo`): all its SQL. `GeoStore.transaction()`
yields a GeoTx whose methods run inside that one transaction."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import cast
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from services.runtime.platform.postgres import autocommit

Conn = AsyncConnection[DictRow]


@dataclass(frozen=True)
class ProjectRow:
    id: UUID
    name: str
    created_at: datetime


class GeoTx:
    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    async def list_projects(self, account_id: UUID) -> list[ProjectRow]:
        cur = await self.conn.execute(
            "SELECT id, name, created_at FROM geo.projects WHERE account_id = %s ORDER BY created_at, id", (account_id,)
        )
        return [ProjectRow(r["id"], r["name"], r["created_at"]) for r in await cur.fetchall()]

    async def insert_project(self, project_id: UUID, account_id: UUID, name: str, now: datetime) -> ProjectRow:
        cur = await self.conn.execute(
            "INSERT INTO geo.projects (id, account_id, name, created_at) VALUES (%s, %s, %s, %s) RETURNING id, name, created_at",
            (project_id, account_id, name, now),
        )
        row = await cur.fetchone()
        assert row is not None
        return ProjectRow(row["id"], row["name"], row["created_at"])

    async def delete_project(self, account_id: UUID, project_id: UUID) -> bool:
        """True if this account's project existed (another account's answers like a missing one)."""
        cur = await self.conn.execute("DELETE FROM geo.projects WHERE id = %s AND account_id = %s", (project_id, account_id))
        return cur.rowcount == 1

    async def lock_account(self, account_id: UUID) -> None:
        """Serialise this account's project creations until the transaction ends, on every replica
        (a transaction-scoped advisory lock on a 64-bit digest of the account id: no row needed)."""
        await self.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"geo.projects:{account_id}",))

    async def count_projects(self, account_id: UUID) -> int:
        cur = await self.conn.execute("SELECT count(*) AS n FROM geo.projects WHERE account_id = %s", (account_id,))
        row = await cur.fetchone()
        assert row is not None
        return int(row["n"])


class GeoStore:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = cast("AsyncConnectionPool[Conn]", pool)  # the host opens it with dict rows

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[GeoTx]:
        async with self._pool.connection() as conn, conn.transaction():
            yield GeoTx(conn)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[GeoTx]:
        """For a one-statement read: no transaction around it (the hot path of API-key calls)."""
        async with autocommit(self._pool) as conn:
            yield GeoTx(conn)
