"""A table's retention (services/runtime/platform/pruner.py) on real Postgres: every old row in one pass,
chunk by chunk; newer rows and rows without a time stay; one replica at a time; a failed pass is
logged and the next one succeeds."""

import logging
from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from services.runtime.platform.pruner import Pruner
from tests.support.metering import wait_until

pytestmark = pytest.mark.integration

CREATE = "CREATE TABLE public.things (id bigserial PRIMARY KEY, at timestamptz, kind text NOT NULL)"
SEED = (
    "INSERT INTO public.things (at, kind) SELECT now() - interval '2 hours', 'old' FROM generate_series(1, 2500);"
    "INSERT INTO public.things (at, kind) SELECT now() - interval '30 minutes', 'new' FROM generate_series(1, 7);"
    "INSERT INTO public.things (at, kind) SELECT NULL, 'timeless' FROM generate_series(1, 3);"
)


@pytest.fixture
async def conn(settings) -> AsyncIterator[psycopg.AsyncConnection]:
    async with await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True) as opened:
        yield opened


def pruner(pool: AsyncConnectionPool, interval_s: float = 60) -> Pruner:
    return Pruner(pool, "public", "things", key="id", column="at", keep_s=3600, interval_s=interval_s, chunk=1000)


async def kinds(conn: psycopg.AsyncConnection) -> dict[str, int]:
    cur = await conn.execute("SELECT kind, count(*) FROM public.things GROUP BY kind")
    return dict(await cur.fetchall())


async def test_one_pass_deletes_every_row_past_the_retention_in_chunks(pool, conn):
    await conn.execute(CREATE)
    await conn.execute(SEED)
    assert await pruner(pool).prune() == 2500
    assert await kinds(conn) == {"new": 7, "timeless": 3}
    assert await pruner(pool).prune() == 0


async def test_while_another_replica_prunes_the_table_a_pass_deletes_nothing(pool, conn):
    await conn.execute(CREATE)
    await conn.execute(SEED)
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('public.things.prune'))")
        assert await pruner(pool).prune() == 0
    assert (await kinds(conn))["old"] == 2500
    assert await pruner(pool).prune() == 2500


async def test_a_failed_pass_is_logged_and_the_next_one_prunes(pool, conn, caplog):
    caplog.set_level(logging.WARNING, logger="services.runtime.platform.pruner")
    task = pruner(pool, interval_s=0.05)
    await task.start()

    async def failure_logged() -> bool:
        return "pruning public.things failed" in caplog.text

    try:
        await wait_until(failure_logged, timeout=5)  # no table yet
        await conn.execute(CREATE)
        await conn.execute(SEED)

        async def old_rows_gone() -> bool:
            return "old" not in await kinds(conn)

        await wait_until(old_rows_gone, timeout=5)
    finally:
        await task.stop()
    assert await kinds(conn) == {"new": 7, "timeless": 3}
