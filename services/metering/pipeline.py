"""Overlap one batch's ClickHouse insert with fetching and parsing the next, keeping
insert-then-commit.

A batch's offsets are committed only by the task that inserted it, after the insert, with the
explicit next offset of each of its partitions (never the consumer's position, which may
already include the next batch). At most one insert is in flight per subscriber, so commits
stay in order. If an insert fails, the consumer is rewound to the first offset of that batch
(and of the batch being parsed meanwhile), so both are consumed again: nothing is committed
past a row that is not in ClickHouse.

It is also the subscriber's rebalance listener: before partitions move, the in-flight insert
finishes and commits (the consumer waits for the callback), and a batch fetched before the
rebalance but not yet submitted is dropped, not written: its partitions' new owner reads it
from the committed offsets, so two members never insert the same batch concurrently.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

log = logging.getLogger(__name__)
Offsets = dict[TopicPartition, int]


def batch_offsets(records: Sequence[Any]) -> tuple[Offsets, Offsets]:
    """(first offset, last offset + 1) of each partition in `records`."""
    first: Offsets = {}
    after: Offsets = {}
    for r in records:
        tp = TopicPartition(r.topic, r.partition)
        if tp not in first or r.offset < first[tp]:
            first[tp] = r.offset
        if r.offset + 1 > after.get(tp, -1):
            after[tp] = r.offset + 1
    return first, after


def _earliest(a: Offsets, b: Offsets) -> Offsets:
    out = dict(b)
    for tp, offset in a.items():
        out[tp] = min(offset, out.get(tp, offset))
    return out


class InsertFailedError(RuntimeError):
    """The previous batch's insert failed; it and the current batch will be consumed again."""


class InsertPipeline(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, name: str) -> None:
        self.name = name
        self.generation = 0  # +1 at every rebalance; a handler notes it before it parses
        self._inflight: asyncio.Task[None] | None = None
        self._first: Offsets = {}

    async def submit(
        self, consumer: AIOKafkaConsumer, records: Sequence[Any], write: Callable[[], Awaitable[Any]], generation: int
    ) -> bool:
        """Start inserting this batch (after the previous insert is done) and return; False if
        the batch was fetched before a rebalance and is dropped (its new owner reads it)."""
        first, after = batch_offsets(records)
        await self.settle(consumer, first)
        if generation != self.generation:
            log.info("%s: dropped a batch fetched before a rebalance; it is read again from the committed offsets", self.name)
            return False
        self._first = first
        self._inflight = asyncio.create_task(self._write_then_commit(consumer, write, first, after))
        return True

    async def settle(self, consumer: AIOKafkaConsumer, pending: Offsets | None = None) -> None:
        """Wait for the in-flight insert. If it failed, rewind to its batch and to `pending` (a
        batch fetched but not written) and raise, so nothing of either is skipped."""
        task, self._inflight = self._inflight, None
        if task is None:
            return
        try:
            await task
        except Exception as exc:
            for tp, offset in _earliest(self._first, pending or {}).items():
                consumer.seek(tp, offset)
            raise InsertFailedError(f"{self.name}: insert failed; the batch will be consumed again") from exc

    async def _write_then_commit(
        self, consumer: AIOKafkaConsumer, write: Callable[[], Awaitable[Any]], first: Offsets, after: Offsets
    ) -> None:
        try:
            await write()
        except Exception:
            # Rewind now (not only when the next batch comes), so an idle topic re-reads it too.
            for tp, offset in first.items():
                consumer.seek(tp, offset)
            log.exception("%s: insert failed; rewinding to the start of the batch", self.name)
            raise
        try:
            await consumer.commit(after)
        except (KafkaError, RuntimeError) as exc:
            # E.g. the partitions moved to another member during a rebalance: it re-reads the
            # batch and its id lookup drops the rows written here.
            log.warning("%s: commit after insert failed (%s); the batch will be re-read and deduplicated", self.name, exc)

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.generation += 1
        await self.drain()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        """Nothing to load: aiokafka resumes each partition from its committed offset."""

    async def drain(self) -> None:
        """At shutdown: let the in-flight insert finish (its commit may fail; it is re-read)."""
        task, self._inflight = self._inflight, None
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
