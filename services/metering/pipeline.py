"""Batch N is written, then its offsets committed, while batch N+1 is fetched and validated.

The event loop's thread validates (pydantic) while the engine writes on another core, so the
sink is as fast as the slower of the two instead of their sum. What keeps it exactly once:
- Each batch commits its own offsets, explicitly, after its write: never the consumer's
  position, which is already past the next batch.
- Batches are written and committed in order, at most one in flight.
- A write that fails rewinds the consumer to that batch and drops the one fetched behind it,
  so nothing behind a failed batch is committed.
- A rebalance waits for the write in flight (and its commit) before giving the partitions up,
  and a batch fetched before the rebalance is dropped: its partitions start again from their
  committed offsets (aiokafka resets positions on every new assignment).
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import attrgetter
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata

log = logging.getLogger(__name__)

RETRY_DELAY_S = 1.0


@dataclass(frozen=True, slots=True)
class Batch:
    lines: list[bytes]
    first: dict[TopicPartition, int]  # where to rewind to
    next: dict[TopicPartition, int]  # what to commit once written

    @staticmethod
    def of(lines: list[bytes], records: Sequence[ConsumerRecord[Any, Any]]) -> "Batch":
        """The batch of `lines`, with the offsets of the records they came from (each
        partition's records are consecutive and in order, as the consumer returns them)."""
        first: dict[TopicPartition, int] = {}
        after: dict[TopicPartition, int] = {}
        for (topic, partition), group in groupby(records, key=attrgetter("topic", "partition")):
            offsets = [record.offset for record in group]
            tp = TopicPartition(topic, partition)
            first[tp] = min(first.get(tp, offsets[0]), offsets[0])
            after[tp] = max(after.get(tp, 0), offsets[-1] + 1)
        return Batch(lines, first, after)


class WritePipeline:
    def __init__(self, write: Callable[[list[bytes]], Awaitable[None]]) -> None:
        self._write = write
        self._inflight: tuple[asyncio.Task[None], Batch] | None = None
        self.epoch = 0  # bumped by every rebalance

    async def submit(self, consumer: AIOKafkaConsumer, batch: Batch, epoch: int) -> None:
        """Start writing `batch` (fetched in `epoch`) once the batch before it is written."""
        if self._inflight is not None:
            previous, self._inflight = self._inflight, None
            try:
                await previous[0]
            except Exception:
                log.exception("metering sink: a batch was not written; fetching it again")
                _rewind(consumer, previous[1], batch)
                await asyncio.sleep(RETRY_DELAY_S)
                return
        if epoch != self.epoch:
            return  # fetched before a rebalance: its partitions restart from their committed offsets
        self._inflight = (asyncio.create_task(self._write_and_commit(consumer, batch)), batch)

    async def drain(self) -> None:
        """Wait for the write in flight (at a rebalance or shutdown); a failed one is fetched
        again from the committed offsets."""
        if self._inflight is not None:
            task, self._inflight = self._inflight[0], None
            try:
                await task
            except Exception:
                log.exception("metering sink: a batch was not written; it will be fetched again")

    async def _write_and_commit(self, consumer: AIOKafkaConsumer, batch: Batch) -> None:
        await self._write(batch.lines)
        offsets = {tp: OffsetAndMetadata(offset, "") for tp, offset in batch.next.items()}
        try:
            await consumer.commit(offsets)
        except KafkaError as exc:
            # The batch is written; if it comes again (another owner, a restart), every id in it
            # is a duplicate. Rebalances drain before giving partitions up, so this is rare.
            log.warning("metering sink: offsets not committed after a write (%r); a redelivery is deduplicated", exc)


class DrainOnRevoke(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, pipeline: WritePipeline) -> None:
        self.pipeline = pipeline

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.pipeline.epoch += 1
        await self.pipeline.drain()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        pass


def _rewind(consumer: AIOKafkaConsumer, failed: Batch, dropped: Batch) -> None:
    """Seek every partition of the failed and the dropped batch back to its first record."""
    for tp, offset in {**dropped.first, **failed.first}.items():  # the failed batch's offsets come first
        if tp in consumer.assignment():
            consumer.seek(tp, offset)
