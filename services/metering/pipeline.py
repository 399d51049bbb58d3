"""Batch N is written, then its offsets committed, while batch N+1 is validated and batch N+2
is fetched.

The event loop's thread unpacks and validates records while the engine writes on another core
(the ClickHouse server), so the sink is as fast as the slower of the two instead of their sum.
What keeps it exactly once:
- Each batch commits its own offsets, explicitly, after its write: never the consumer's
  position, which is already past the batches behind it.
- Batches are written and committed in order, one at a time; at most `DEPTH` are in the
  pipeline (the consumer's loop waits for the oldest before handing on another).
- A batch whose preparation or write fails rewinds the consumer after a backoff (0.5 s, doubling
  at each failure in a row up to 30 s: runtime/platform/redelivery.py, which logs each attempt
  once and counts it in `tollgate_consumer_failures_total`), so it is written again even if
  nothing else arrives, and the batches fetched behind it are dropped: every partition
  goes back to its first offset in the failed batch or behind it, before the next fetch. Nothing
  behind a failed batch is committed, and nothing of it is skipped.
- A rebalance waits for the batches in the pipeline (the ones fetched before it are dropped: their
  partitions start again from their committed offsets, as aiokafka resets positions on every new
  assignment) before giving the partitions up.
- At shutdown the batch being written is finished and committed, and none after it is started,
  before the consumer leaves its group (aiokafka calls no rebalance listener on close).
"""

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata

from services.runtime.platform.redelivery import Redelivery

log = logging.getLogger(__name__)

RETRY_DELAY_S = 1.0  # between attempts to join the group again (consumers.TopicSink)
DEPTH = 2  # one batch being written, one being prepared

Records = Sequence[ConsumerRecord[Any, Any]]
Fetched = dict[TopicPartition, list[ConsumerRecord[Any, Any]]]


@dataclass(frozen=True, slots=True, eq=False)  # a batch is itself: compared by identity
class Batch:
    first: dict[TopicPartition, int]  # where to rewind to
    next: dict[TopicPartition, int]  # what to commit once written

    @staticmethod
    def of(fetched: Fetched) -> "Batch":
        """The offsets of what `getmany` returned (each partition's records, in order)."""
        first = {tp: records[0].offset for tp, records in fetched.items() if records}
        after = {tp: records[-1].offset + 1 for tp, records in fetched.items() if records}
        return Batch(first, after)


P = TypeVar("P")  # a prepared batch: what `prepare` hands to `write` (the lines to write, and what goes with them)
Prepare = Callable[[Records], Coroutine[Any, Any, P]]  # validate, dead-letter: what to write
Write = Callable[[P], Awaitable[None]]


class WritePipeline(Generic[P]):
    def __init__(self, prepare: Prepare[P], write: Write[P], redelivery: Redelivery) -> None:
        self._prepare = prepare
        self._write = write
        self._redelivery = redelivery
        self._batches: deque[tuple[Batch, asyncio.Task[None]]] = deque()  # in order; each waits for the one before
        # After a failed batch: the partitions rewound, until a batch fetched after that is written.
        self._rewound: set[TopicPartition] | None = None
        self._closed = False
        self._wake = asyncio.Event()  # set (and replaced) when a failed batch's wait must end early
        # Bumped when the consumer's positions move under the pipeline (a rebalance, a rewind):
        # a batch fetched before that is dropped. The consumer's loop reads it right after the
        # fetch, before its next await.
        self.epoch = 0

    async def submit(self, consumer: AIOKafkaConsumer, fetched: Fetched, epoch: int) -> None:
        """Start preparing what `getmany` returned in `epoch` now, and write it after the batches
        before it. Only the preparation holds the records, so they are freed once validated: the
        collector's passes over them grow with the records kept alive."""
        batch = Batch.of(fetched)
        while len(self._batches) >= DEPTH:
            await self._wait_oldest()
        if epoch != self.epoch:
            # Fetched before the positions moved. Dropped here, before the consumer's loop fetches
            # again: after a failed batch, that fetch must already start from the rewound
            # offsets of every partition this batch holds.
            self._rewind_uncovered(consumer, [batch])
            return
        if self._closed:
            return
        prepared = asyncio.create_task(self._prepare([record for records in fetched.values() for record in records]))
        before = self._batches[-1][1] if self._batches else None
        self._batches.append((batch, asyncio.create_task(self._run(consumer, batch, epoch, prepared, before))))

    async def drain(self) -> None:
        """Wait for every batch in the pipeline to be written and committed, or dropped."""
        while self._batches:
            await self._wait_oldest()

    async def close(self) -> None:
        """Before the consumer stops (and leaves its group): finish and commit the write in
        flight, and start no other (the batches handed in later are fetched again after a restart)."""
        self._closed = True
        self._wake_waiting()
        await self.drain()

    def revoked(self) -> None:
        self.epoch += 1
        self._rewound = None  # the next assignment starts from the committed offsets
        self._wake_waiting()

    def _wake_waiting(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    async def _wait(self, seconds: float) -> None:
        wake = self._wake
        try:
            await asyncio.wait_for(wake.wait(), seconds)
        except TimeoutError:
            pass

    async def _wait_oldest(self) -> None:
        oldest = self._batches[0]
        await asyncio.shield(oldest[1])  # a cancelled caller must not cancel the write
        if self._batches and self._batches[0] is oldest:
            self._batches.popleft()

    async def _run(
        self,
        consumer: AIOKafkaConsumer,
        batch: Batch,
        epoch: int,
        prepared: asyncio.Task[P],
        before: asyncio.Task[None] | None,
    ) -> None:
        if before is not None:
            await before  # never raises: a failure is handled in its own task
        if epoch != self.epoch or self._closed:
            _discard(prepared)  # its partitions were rewound when the epoch moved, if needed
            return
        try:
            await self._write(await prepared)
        except Exception as exc:
            # Logged, then a wait before the batch is fetched again; cut short by a rebalance or
            # a shutdown, which need this task done (they drop the batch anyway).
            await self._wait(self._redelivery.failed(exc))
            if epoch != self.epoch or self._closed:
                return  # revoked meanwhile: the next assignment starts from the committed offsets
            # All at once, before the next fetch: this batch's offsets, then those of the batches
            # behind it that this one does not cover (each partition to its earliest offset).
            queued = [b for b, _ in self._batches]
            self._rewound = set()
            self._rewind_uncovered(consumer, queued[queued.index(batch) :])
            self.epoch += 1  # after the seek: whatever was fetched before it is dropped
            return
        self._rewound = None
        self._redelivery.succeeded()
        offsets = {tp: OffsetAndMetadata(offset, "") for tp, offset in batch.next.items()}
        try:
            await consumer.commit(offsets)
        except KafkaError as exc:
            # The batch is written; if it comes again (another owner, a restart), every id in it
            # is a duplicate. Rebalances and shutdown drain before giving partitions up, so this is rare.
            log.warning("metering sink: offsets not committed after a write (%r); a redelivery is deduplicated", exc)

    def _rewind_uncovered(self, consumer: AIOKafkaConsumer, batches: list[Batch]) -> None:
        """After a failed batch, seek each partition of `batches` (in fetch order) that no rewind
        since covered back to its first offset: the first batch holding a partition has its
        earliest. After a rebalance there is nothing to do (positions restart from the commits)."""
        if self._rewound is None:
            return
        for batch in batches:
            uncovered = {tp: offset for tp, offset in batch.first.items() if tp not in self._rewound}
            _rewind(consumer, uncovered)
            self._rewound.update(uncovered)


class DrainOnRevoke(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, pipeline: WritePipeline[Any]) -> None:
        self.pipeline = pipeline

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.pipeline.revoked()
        await self.pipeline.drain()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        pass


def _discard(task: asyncio.Task[Any]) -> None:
    """Cancel a task whose result is not needed (and retrieve the error it may have ended with)."""
    task.cancel()
    task.add_done_callback(lambda t: t.cancelled() or t.exception())


def _rewind(consumer: AIOKafkaConsumer, first: dict[TopicPartition, int]) -> None:
    """Seek each partition still assigned back to the given offset (its next fetch starts there)."""
    for tp, offset in first.items():
        if tp in consumer.assignment():
            consumer.seek(tp, offset)
