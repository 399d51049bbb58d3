"""Retention of a Postgres table: a background task deletes the rows older than an age, in chunks.

Every `interval_s` a pass deletes the rows whose time `column` lies more than `keep_s` in the
past (by the database's clock, which wrote those times), oldest first, `chunk` rows per
transaction until a chunk comes back short: short transactions and short row locks, so the
table's writers barely notice. A row whose time is NULL is never deleted (`NULL < t` is not true).

Any replica may prune: nothing else touches a row once it is past the retention, and a row two
replicas both pick is deleted by one and skipped by the other. A transaction-scoped advisory
try-lock per table only saves the duplicate work: a replica that does not get it skips that pass.
A failed pass is logged and the next one tries again; `stop()` cancels the task (psycopg cancels
the statement in flight, and its chunk rolls back).
"""

import logging
from datetime import timedelta
from typing import cast

from prometheus_client import Counter
from psycopg import AsyncConnection, sql
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from services.runtime.platform.periodic import Periodic
from services.runtime.platform.postgres import try_xact_lock

log = logging.getLogger(__name__)

PRUNED_ROWS = Counter("tollgate_pruned_rows_total", "Rows deleted by a table's retention, by table (unit: rows)", ["table"])


class Pruner:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        schema: str,
        table: str,
        *,
        key: str,
        column: str,
        keep_s: float,
        interval_s: float,
        chunk: int = 1000,
    ) -> None:
        self._pool = cast("AsyncConnectionPool[AsyncConnection[DictRow]]", pool)  # dict rows
        self._name = f"{schema}.{table}"
        PRUNED_ROWS.labels(self._name)  # on /metrics at 0 before the first deletion
        self._keep = timedelta(seconds=keep_s)
        self._chunk = chunk
        self._delete = sql.SQL(
            # = ANY(ARRAY(...)): the chunk's keys first, then found on the primary key (`IN (...)`
            # let the planner hash-join the subquery against a scan of the whole table).
            "DELETE FROM {table} WHERE {key} = ANY(ARRAY("
            "SELECT {key} FROM {table} WHERE {column} < now() - %s ORDER BY {column} LIMIT %s))"
        ).format(table=sql.Identifier(schema, table), key=sql.Identifier(key), column=sql.Identifier(column))
        self._periodic = Periodic(f"prune:{self._name}", interval_s, self.prune, what=f"pruning {self._name}", log=log)

    async def start(self) -> None:
        await self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    async def prune(self) -> int:
        """One pass: delete every row older than the retention; returns how many were deleted."""
        total = 0
        while True:
            async with self._pool.connection() as conn:
                if not await try_xact_lock(conn, f"{self._name}.prune"):
                    return total  # another replica is pruning this table right now
                deleted = (await conn.execute(self._delete, (self._keep, self._chunk))).rowcount
            total += deleted
            PRUNED_ROWS.labels(self._name).inc(deleted)
            if deleted < self._chunk:
                return total
