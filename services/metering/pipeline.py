"""Batch N is written, then its offsets committed, while batch N+1 is fetched and validated.

The event loop's thread validates (pydantic) while the engine writes on another core, so the
sink is as fast as the slower of the two instead of their sum. What keeps it exactly once:
- Each batch commits its own offsets, explicitly, after its write: never the consumer's
  position, which is already past the next batch.
- Batches are written and committed in order, at most one in flight.
- A write that fails rewinds the consumer to that batch at once (it is written again even if
  nothing else arrives) and drops the one fetched behind it, so nothing behind a failed batch
  is committed.
- A rebalance waits for the write in flight (and its commit) before giving the partitions up,
  and a batch fetched before the rebalance is dropped: its partitions start again from their
  committed offsets (aiokafka resets positions on every new assignment).
- At shutdown the write in flight is finished and committed before the consumer leaves its
  group (aiokafka calls no rebalance listener on close).
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
        self._inflight: asyncio.Task[None] | None = None
        self._failed: Batch | None = None  # the last batch whose write failed, until one behind it is taken
        self._closed = False
        # Bumped when the consumer's positions move under the pipeline (a rebalance, a rewind):
        # a batch fetched before that is dropped. The handler reads it before its first await,
        # right after the fetch (FastStream calls it without suspending in between).
        self.epoch = 0

    async def submit(self, consumer: AIOKafkaConsumer, batch: Batch, epoch: int) -> None:
        """Start writing `batch` (fetched in `epoch`) once the batch before it is written."""
        await self.drain()
        if epoch != self.epoch or self._closed:
            # Fetched before a rebalance (its partitions restart from their committed offsets),
            # or behind a failed batch: fetch again what that rewind did not cover.
            if self._failed is not None:
                _rewind(consumer, {tp: o for tp, o in batch.first.items() if tp not in self._failed.first})
            return
        self._failed = None
        self._inflight = asyncio.create_task(self._write_and_commit(consumer, batch))

    async def drain(self) -> None:
        """Wait for the write in flight, its commit or its rewind."""
        while self._inflight is not None:
            task = self._inflight
            await asyncio.shield(task)  # a cancelled caller must not cancel the write
            if self._inflight is task:
                self._inflight = None

    async def close(self) -> None:
        """Before the consumer stops (and leaves its group): finish and commit the write in
        flight, and start no other (a batch handed in later is fetched again after a restart)."""
        self._closed = True
        await self.drain()

    def revoked(self) -> None:
        self.epoch += 1
        self._failed = None  # the next assignment starts from the committed offsets

    async def _write_and_commit(self, consumer: AIOKafkaConsumer, batch: Batch) -> None:
        try:
            await self._write(batch.lines)
        except Exception:
            log.exception("metering sink: a batch was not written; fetching it again")
            await asyncio.sleep(RETRY_DELAY_S)
            _rewind(consumer, batch.first)
            self.epoch += 1  # after the seek: whatever was fetched before it is dropped
            self._failed = batch
            return
        offsets = {tp: OffsetAndMetadata(offset, "") for tp, offset in batch.next.items()}
        try:
            await consumer.commit(offsets)
        except KafkaError as exc:
            # The batch is written; if it comes again (another owner, a restart), every id in it
            # is a duplicate. Rebalances and shutdown drain before giving partitions up, so this is rare.
            log.warning("metering sink: offsets not committed after a write (%r); a redelivery is deduplicated", exc)


class DrainOnRevoke(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, pipeline: WritePipeline) -> None:
        self.pipeline = pipeline

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.pipeline.revoked()
        await self.pipeline.drain()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        pass


def _rewind(consumer: AIOKafkaConsumer, first: dict[TopicPartition, int]) -> None:
    """Seek each partition still assigned back to the given offset (its next fetch starts there)."""
    for tp, offset in first.items():
        if tp in consumer.assignment():
            consumer.seek(tp, offset)
