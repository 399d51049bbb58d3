"""The relay is woken by the commit that adds rows (LISTEN/NOTIFY), in whichever process wrote them:
nothing waits for its periodic pass."""

import asyncio

import pytest

from contracts.topics import KEYS
from services.runtime.platform.kafka import ensure_topics
from services.runtime.platform.outbox_relay import OutboxRelay
from tests.support.metering import wait_until

pytestmark = pytest.mark.integration


async def _all_sent(pool) -> bool:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM keys.outbox WHERE sent_at IS NULL")
        row = await cur.fetchone()
        return row is not None and row["n"] == 0


async def test_a_commit_anywhere_wakes_the_relay_at_once(settings, pool):
    await ensure_topics(settings, (KEYS,))
    relay = OutboxRelay(pool, settings, "keys", interval_s=3600)  # its own pass never comes
    writer = OutboxRelay(pool, settings, "keys")  # another replica's, not started: it neither flushes nor wakes
    await relay.start()
    try:
        await asyncio.sleep(1)  # the listener is in, and its first pass (for rows from before it) is over
        async with pool.connection() as conn:
            await writer.add(conn, KEYS, b"k", b"v")
        await wait_until(lambda: _all_sent(pool), timeout=5, interval=0.02)
    finally:
        await relay.stop()


async def test_a_listener_whose_connection_postgres_closed_listens_again(settings, pool):
    await ensure_topics(settings, (KEYS,))
    relay = OutboxRelay(pool, settings, "keys", interval_s=3600)  # its own pass never comes
    writer = OutboxRelay(pool, settings, "keys")
    await relay.start()
    try:
        await asyncio.sleep(1)
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE 'LISTEN%%'"
            )
            row = await cur.fetchone()
            assert row is not None and row["n"] == 1  # the relay's listener, waiting on its socket
        await asyncio.sleep(2)  # it sees the socket close and connects again (after RETRY_S)
        async with pool.connection() as conn:
            await writer.add(conn, KEYS, b"k", b"v")
        await wait_until(lambda: _all_sent(pool), timeout=5, interval=0.02)
    finally:
        await relay.stop()
