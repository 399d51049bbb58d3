"""The relay is woken by the commit that adds rows (LISTEN/NOTIFY), in whichever process wrote them:
nothing waits for its periodic pass."""

import asyncio

import pytest

from contracts.topics import KEYS
from services.runtime.platform.kafka import ensure_topics
from services.runtime.platform.outbox_relay import OutboxRelay
from tests.support.metering import wait_until

pytestmark = pytest.mark.integration


async def test_a_commit_anywhere_wakes_the_relay_at_once(settings, pool):
    await ensure_topics(settings, (KEYS,))
    relay = OutboxRelay(pool, settings, "keys", interval_s=3600)  # its own pass never comes
    writer = OutboxRelay(pool, settings, "keys")  # another replica's, not started: it neither flushes nor wakes
    await relay.start()
    try:
        await asyncio.sleep(1)  # the listener is in, and its first pass (for rows from before it) is over
        async with pool.connection() as conn:
            await writer.add(conn, KEYS, b"k", b"v")

        async def sent() -> bool:
            async with pool.connection() as conn:
                cur = await conn.execute("SELECT count(*) AS n FROM keys.outbox WHERE sent_at IS NULL")
                row = await cur.fetchone()
                return row is not None and row["n"] == 0

        await wait_until(sent, timeout=5, interval=0.02)
    finally:
        await relay.stop()
