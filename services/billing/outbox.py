"""The outbox relay: publishes billing's committed events to Kafka in order, marks them sent.

Writers call `flush()` after their commit (the event is in Kafka before their response); a
background loop also polls, for rows left by a crashed process or another replica.
SKIP LOCKED lets replicas relay side by side; an event published but not yet marked sent when
a process dies is published again, and consumers are idempotent on the event id."""

import asyncio
import contextlib
import logging

from faststream.kafka import KafkaBroker
from psycopg_pool import AsyncConnectionPool

from services.billing import store

log = logging.getLogger(__name__)


class OutboxRelay:
    def __init__(self, pool: AsyncConnectionPool, broker: KafkaBroker, poll_seconds: float = 0.5) -> None:
        self._pool = pool
        self._broker = broker
        self._poll = poll_seconds
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    async def flush(self) -> int:
        sent = 0
        async with self._lock:
            while True:
                async with self._pool.connection() as conn, conn.transaction():
                    rows = await store.take_unsent(conn, 200)
                    if not rows:
                        return sent
                    for row in rows:  # one at a time: billing.v1 keeps the commit order per account
                        await self._broker.publish(bytes(row["payload"]), row["topic"], key=bytes(row["key"]))
                    await store.mark_sent(conn, [r["seq"] for r in rows])
                    sent += len(rows)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="billing-outbox")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                await self.flush()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("outbox relay failed; retrying", exc_info=True)
            await asyncio.sleep(self._poll)
