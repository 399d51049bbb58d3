"""Kafka is transport, never the store of record: an owner re-emits its states when Kafka lost them.

Each service that owns compacted state (keys, billing, quota) keeps the truth in Postgres and
publishes every change to its topics. Should a topic lose its records (a lost disk, a rebuilt
cluster, a deleted topic), every edge that rebuilds its projection from it would refuse what
Postgres still holds. So each owner checks, in every process at its start and every
`CHECK_INTERVAL_S` while it runs, whether each of its topics holds fewer records than Postgres
holds live states for it: a compacted topic keeps at least the newest record of every live key,
so fewer records than states means states are missing for certain. Then it re-emits the current
state of every object of those topics (its `republish` use case, through its outbox or its
publisher). A pass costs a topic listing, two offset queries and one count in Postgres. (A
topic that lost only some records but still holds as many as there are states is not caught:
`tollgate republish` is for that, and harmless.)

Republishing is harmless while the services run: every state carries its row's version
(contracts/events.py, order_of) and consumers keep the newest, and the use cases read the rows
under a share lock, so a concurrent write publishes after the republished state, never before.
A topic that does not exist (the broker's data was wiped under a running stack) is created first.
One process at a time checks (a Postgres advisory lock): a second one waits, then finds the
topics full and does nothing. While a process's first check runs, its edge is not ready
(`Edge.rebuilding`: /readyz and every credential 503), and it stays so until its projections
have read what the check published: no key is judged by a projection still being rebuilt.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import cast

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from contracts.topics import Topic
from services.runtime.platform.kafka import ensure_topics
from services.runtime.platform.periodic import Periodic
from services.runtime.platform.settings import Settings

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 30.0
FIRST_RETRY_S = 1.0

Held = Callable[[], Awaitable[Mapping[str, int]]]
"""The owner's count of live states per topic name (its Postgres)."""
Republish = Callable[[list[str]], Awaitable[Mapping[str, int]]]
"""The owner's use case: re-emit every state of these topics; how many per topic."""


def short_topics(records: Mapping[str, int], held: Mapping[str, int]) -> list[str]:
    """The topics that hold fewer records than the owner holds live states: certainly missing some."""
    return [topic for topic, states in held.items() if records.get(topic, 0) < states]


async def record_counts(settings: Settings, topics: Sequence[Topic]) -> dict[str, int]:
    """How many records each topic holds now (end minus beginning offsets, over its partitions).
    If one does not exist, every missing topic of Tollgate's is created first (empty, then)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
    finally:
        await admin.close()
    missing = [t.name for t in topics if settings.topic(t.name) not in existing]
    if missing:
        # the broker lost its data under a running stack: every topic is gone, not just these
        log.warning("topics %s are gone from Kafka: creating every missing topic", missing)
        await ensure_topics(settings)
    reader = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap_servers, enable_auto_commit=False)
    await reader.start()
    try:
        partitions = [TopicPartition(settings.topic(t.name), p) for t in topics for p in range(t.partitions)]
        ends = await reader.end_offsets(partitions)
        starts = await reader.beginning_offsets(partitions)
    finally:
        await reader.stop()
    by_name = {settings.topic(t.name): t.name for t in topics}
    counts = dict.fromkeys((t.name for t in topics), 0)
    for tp, end in ends.items():
        counts[by_name[tp.topic]] += end - starts.get(tp, 0)
    return counts


class StateGuard:
    """Run in every process of the owner (on_start/on_stop). The first check runs in the
    background under `hold` (the edge's `rebuilding()`: not ready, every credential 503, until
    it is done and the projections have read what it published), and is retried every
    `FIRST_RETRY_S` until it succeeds; then one check every `interval_s`, not held (a running
    edge still holds every state in memory)."""

    def __init__(
        self,
        settings: Settings,
        pool: AsyncConnectionPool,
        owner: str,
        topics: Sequence[Topic],
        held: Held,
        republish: Republish,
        *,
        hold: Callable[[], AbstractAsyncContextManager[None]] | None = None,
        interval_s: float = CHECK_INTERVAL_S,
    ) -> None:
        self._settings = settings
        self._pool = cast("AsyncConnectionPool[AsyncConnection[DictRow]]", pool)
        self._owner = owner
        self._topics = tuple(topics)
        self._held = held
        self._republish = republish
        self._hold = hold or nullcontext
        self._first: asyncio.Task[None] | None = None
        self._periodic = Periodic(f"state-guard:{owner}", interval_s, self.check, what=f"checking {owner}'s topics", log=log)

    async def start(self) -> None:
        held = self._hold()
        await held.__aenter__()  # not ready from now on, until the first check is done
        self._first = asyncio.create_task(self._first_check(held), name=f"state-guard-first:{self._owner}")

    async def _first_check(self, held: AbstractAsyncContextManager[None]) -> None:
        try:
            while True:
                try:
                    await self.check()
                    break
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.warning("%s could not check its topics; retrying in %ss", self._owner, FIRST_RETRY_S, exc_info=True)
                    await asyncio.sleep(FIRST_RETRY_S)
        except BaseException as exc:
            await held.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        try:
            await held.__aexit__(None, None, None)  # the edge reads what the check published
        except Exception:  # Kafka away right then: the edge follows the topics as ever
            log.warning("%s's edge could not wait for its topics' end", self._owner, exc_info=True)
        await self._periodic.start()

    async def stop(self) -> None:
        if self._first is not None:
            self._first.cancel()
            await asyncio.gather(self._first, return_exceptions=True)
        await self._periodic.stop()

    async def check(self) -> dict[str, int]:
        """Republish the topics Kafka lost states of; what was republished, per topic."""
        async with self._pool.connection() as conn:
            # held until this connection's transaction ends, after the republish: one process at a time
            lock = f"{self._settings.topic_prefix}state-guard:{self._owner}"
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock,))
            short = short_topics(await record_counts(self._settings, self._topics), await self._held())
            if not short:
                return {}
            log.warning("%s: Kafka lost states of %s; republishing them from Postgres", self._owner, short)
            done = dict(await self._republish(short))
            log.info("%s republished %s", self._owner, done)
            return done
