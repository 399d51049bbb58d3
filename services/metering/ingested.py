"""The idempotency window of POST /api/usage/events: the ids it accepted, in Postgres, forgotten after it.

The endpoint answers a re-sent id as a duplicate while `metering.ingested_events` holds it: at
least USAGE_IDEMPOTENCY_WINDOW_SECONDS, at most one prune interval more. After that the id is
accepted and published again, and the sink still drops it as the same event (same id, account
and hour; docs/clickhouse.md), as quota does (`quota.processed_events`).
"""

from uuid import UUID

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from contracts.events import UsageEvent
from services.edge import Runtime
from services.runtime.platform.pruner import Pruner


class IngestedIds:
    """The ids the endpoint accepted within the window (all its Postgres SQL)."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool

    async def known(self, ids: list[UUID]) -> set[UUID]:
        async with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute("SELECT id FROM metering.ingested_events WHERE id = ANY(%s)", [ids])
            return {row["id"] for row in await cur.fetchall()}

    async def remember(self, events: list[UsageEvent]) -> int:
        """Record the events' ids; how many were not recorded yet (a concurrent request may have won)."""
        if not events:
            return 0
        async with self.pool.connection() as conn, conn.cursor() as cur:
            await cur.execute(
                "INSERT INTO metering.ingested_events (id, account_id) SELECT * FROM unnest(%s::uuid[], %s::uuid[]) "
                "ON CONFLICT (id) DO NOTHING RETURNING id",
                [[e.id for e in events], [e.account_id for e in events]],
            )
            return len(await cur.fetchall())


def ingested_events_pruner(runtime: Runtime) -> Pruner:
    settings = runtime.settings
    return Pruner(
        runtime.pool,
        "metering",
        "ingested_events",
        key="id",
        column="received_at",
        keep_s=settings.usage_idempotency_window_seconds,
        interval_s=settings.prune_interval_seconds,
    )
