"""Kafka is transport, never the store of record: an owner re-emits its states when Kafka lost them.

Each service that owns compacted state (keys, billing, quota) keeps the truth in Postgres and
publishes every change to its topics. Should a topic lose its records (a lost disk, a rebuilt
cluster, a deleted topic), every edge that rebuilds its projection from it would refuse what
Postgres still holds. So each owner checks, in every process at its start and every
`CHECK_INTERVAL_S` while it runs, whether each of its topics holds fewer records than Postgres
holds live states for it: a compacted topic keeps at least the newest record of every live key,
so fewer records than states means states are missing for certain. Then it re-emits the current
state of every object of those topics (its `republish` use case, through its outbox or its
publisher). A pass costs a metadata question on its own topics, two offset queries and one count
in Postgres, on clients it keeps (services/runtime/platform/cluster.py). (A
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

A check that finds every topic holding the owner's states (at once, or once its republish is in
Kafka) writes the owner's record to state-complete.v1 (contracts/events.py, StateComplete). A
wiped Kafka loses those records too, and an edge is ready only once it holds every owner's
record: a process that runs no owner (`--target geo`) started on empty topics stays 503 until
the owners' checks have given their states again (services/edge/state_complete.py).
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

from aiokafka import TopicPartition
from faststream.kafka import KafkaBroker
from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from contracts.events import StateComplete
from contracts.topics import STATE_COMPLETE, Topic
from services.runtime.platform.cluster import ClusterReader
from services.runtime.platform.kafka import ensure_topics, within_publish_timeout
from services.runtime.platform.periodic import Periodic
from services.runtime.platform.settings import Settings

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 30.0
FIRST_RETRY_S = 1.0

Held = Callable[[], Awaitable[Mapping[str, int]]]
"""The owner's count of live states per topic name (its Postgres)."""
Republish = Callable[[list[str]], Awaitable[Mapping[str, int]]]
"""The owner's use case: re-emit every state of these topics; how many per topic."""
Announce = Callable[[StateComplete], Awaitable[None]]
"""Writes the owner's record to state-complete.v1."""


@dataclass(frozen=True)
class Checked:
    republished: dict[str, int]  # how many states per topic the check gave again
    complete: bool  # every topic held the owner's states at the end: its record was written


def short_topics(records: Mapping[str, int], held: Mapping[str, int]) -> list[str]:
    """The topics that hold fewer records than the owner holds live states: certainly missing some."""
    return [topic for topic, states in held.items() if records.get(topic, 0) < states]


async def check_topics(
    owner: str, counts: Callable[[], Awaitable[Mapping[str, int]]], held: Held, republish: Republish, announce: Announce
) -> Checked:
    """One check: republish the topics that hold fewer records than the owner's live states, count
    again, and write the owner's record once none is short (if the republish is not all in Kafka
    yet, the next check writes it)."""
    states = dict(await held())
    short = short_topics(await counts(), states)
    republished: dict[str, int] = {}
    if short:
        log.warning("%s: Kafka lost states of %s; republishing them from Postgres", owner, short)
        republished = dict(await republish(short))
        log.info("%s republished %s", owner, republished)
        short = short_topics(await counts(), states)
    if short:
        log.warning("%s: %s still short after republishing; checking again", owner, short)
        return Checked(republished, complete=False)
    await announce(StateComplete(time=datetime.now(UTC), owner=owner, held=states))
    return Checked(republished, complete=True)


async def record_counts(settings: Settings, cluster: ClusterReader, topics: Sequence[Topic]) -> dict[str, int]:
    """How many records each topic holds now (end minus beginning offsets, over its partitions).
    If one does not exist, every missing topic of Tollgate's is created first (empty, then)."""
    missing = await cluster.missing([settings.topic(t.name) for t in topics])
    if missing:
        # the broker lost its data under a running stack: every topic is gone, not just these
        log.warning("topics %s are gone from Kafka: creating every missing topic", missing)
        await ensure_topics(settings)
    partitions = [TopicPartition(settings.topic(t.name), p) for t in topics for p in range(t.partitions)]
    starts, ends = await cluster.offsets(partitions)
    by_name = {settings.topic(t.name): t.name for t in topics}
    counts = dict.fromkeys((t.name for t in topics), 0)
    for tp, end in ends.items():
        counts[by_name[tp.topic]] += end - starts.get(tp, 0)
    return counts


class StateGuard:
    """Run in every process of the owner (on_start/on_stop). The first check runs in the
    background under `hold` (the edge's `rebuilding()`: not ready, every credential 503, until
    it is done and the projections have read what it published), and is tried again after
    `FIRST_RETRY_S`, then twice as long each time (up to `interval_s`), until it has written the
    owner's record; then one check every `interval_s`, not held (a running edge still holds every
    state in memory)."""

    def __init__(
        self,
        settings: Settings,
        pool: AsyncConnectionPool,
        broker: KafkaBroker,
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
        self._broker = broker
        self._owner = owner
        self._topics = tuple(topics)
        self._held = held
        self._republish = republish
        self._hold = hold or nullcontext
        self._interval_s = interval_s
        self._cluster = ClusterReader(settings.kafka_bootstrap_servers)
        self._first: asyncio.Task[None] | None = None
        self._periodic = Periodic(f"state-guard:{owner}", interval_s, self.check, what=f"checking {owner}'s topics", log=log)

    async def start(self) -> None:
        held = self._hold()
        await held.__aenter__()  # not ready from now on, until the first check is done
        self._first = asyncio.create_task(self._first_check(held), name=f"state-guard-first:{self._owner}")

    async def _first_check(self, held: AbstractAsyncContextManager[None]) -> None:
        pause = FIRST_RETRY_S
        try:
            while not await self._check_complete():
                await asyncio.sleep(pause)
                pause = min(pause * 2, self._interval_s)
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
        await self._cluster.close()

    async def _check_complete(self) -> bool:
        try:
            return (await self.check()).complete
        except Exception:
            log.warning("%s could not check its topics; trying again", self._owner, exc_info=True)
            return False

    async def check(self) -> Checked:
        """Republish the topics Kafka lost states of; write the owner's record once none is short."""
        async with self._pool.connection() as conn:
            # held until this connection's transaction ends, after the republish: one process at a time
            lock = f"{self._settings.topic_prefix}state-guard:{self._owner}"
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock,))
            return await check_topics(
                self._owner,
                lambda: record_counts(self._settings, self._cluster, self._topics),
                self._held,
                self._republish,
                self._announce,
            )

    async def _announce(self, record: StateComplete) -> None:
        topic = self._settings.topic(STATE_COMPLETE.name)
        await within_publish_timeout(self._broker.publish(record.model_dump_json().encode(), topic, key=self._owner.encode()))
