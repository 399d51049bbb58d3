"""The outbox relay deletes sent rows older than OUTBOX_RETENTION_SECONDS, on every service's
outbox: never a recent sent row, never an unsent one, and whoever holds the publishing lock."""

import psycopg
import pytest
from psycopg import sql

from services.runtime.platform.outbox_relay import OutboxRelay
from tests.support.metering import wait_until

pytestmark = pytest.mark.integration

HOUR = 3600
# (marker in the topic column, rows, age of created_at, age of sent_at or None for unsent)
ROWS = [
    ("old-sent", 2500, "3 hours", "2 hours"),  # more than two prune chunks
    ("recent-sent", 10, "3 hours", "50 minutes"),
    ("old-unsent", 10, "2 days", None),
    ("new-unsent", 10, "0 seconds", None),
]


async def _counts(conn: psycopg.AsyncConnection, schema: str) -> dict[tuple[str, bool], int]:
    cur = await conn.execute(
        sql.SQL("SELECT topic, sent_at IS NULL, count(*) FROM {} GROUP BY 1, 2").format(sql.Identifier(schema, "outbox"))
    )
    return {(topic, unsent): n for topic, unsent, n in await cur.fetchall()}


@pytest.mark.parametrize("schema", ["keys", "billing", "geo", "alerts"])
async def test_the_relay_deletes_only_rows_sent_longer_ago_than_the_retention(settings, pool, schema):
    settings = settings.model_copy(update={"outbox_retention_seconds": HOUR, "prune_interval_seconds": 0.1})
    table = sql.Identifier(schema, "outbox")
    async with await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True) as conn:
        for marker, n, created, sent in ROWS:
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {} (topic, key, value, created_at, sent_at) "
                    "SELECT %s, 'k', NULL, now() - %s::interval, now() - %s::interval FROM generate_series(1, %s)"
                ).format(table),
                (marker, created, sent, n),
            )
        # Another replica holds the publishing lock: the unsent rows stay unsent while the
        # relay runs, and pruning must not wait for that lock.
        await conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (f"{schema}.outbox",))
        relay = OutboxRelay(pool, settings, schema)
        await relay.start()
        try:

            async def old_rows_gone() -> bool:
                return ("old-sent", False) not in await _counts(conn, schema)

            await wait_until(old_rows_gone, timeout=8)
        finally:
            await relay.stop()
        assert await _counts(conn, schema) == {("recent-sent", False): 10, ("old-unsent", True): 10, ("new-unsent", True): 10}
