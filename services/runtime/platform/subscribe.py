"""The one way a service subscribes to a topic: typed events in, offsets committed after the write.

Every subscriber has the same skeleton, so it is written once here:
- its own consumer group (subscribers sharing a group would rebalance each other every time
  one of them starts or stops), read from the earliest offset on a first start;
- `AckPolicy.NACK_ON_ERROR`: the offset is committed only after the handler returned; an error
  rewinds to the message (or the batch's first record), and the handler's idempotency on the
  event id makes the replay harmless;
- each record parsed into its contract model, or dead-lettered with the reason (malformed, or
  breaking a rule judged against the record's own timestamp) while the subscriber goes on;
- compacted topics' tombstones (a record without a value) skipped;
- a valid event the database cannot store (`psycopg.DataError`, SQLSTATE class 22: a NUL in a
  text, a number past its column) dead-lettered with the database's reason: it would fail at
  every redelivery and hold its group for good. In a batch, the halves are handled again until
  the event is found (the handlers are idempotent);
- any other error (a bug on one event, Postgres down) is retried as above, never dead-lettered,
  after a wait that doubles at each failure in a row up to 30 s (redelivery.py: one log line and
  one `tollgate_consumer_failures_total` per attempt), instead of at once, ~160 times a second.
  A partition a rebalance took away during that wait is not rewound (`rewind`): its next owner
  starts from its committed offset, which is before the failed records;
- the pace of every consumer (`kafka.FETCH_WAIT_MS`, `kafka.IDLE_WAKE_MS`, then `fetch_pace` once
  idle, set by `kafka.start_subscribers`): no latency floor, an idle process's CPU.
"""

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import psycopg
from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.errors import IllegalStateError
from faststream import AckPolicy
from faststream.exceptions import SkipMessage
from faststream.kafka import KafkaBroker, KafkaRouter
from faststream.kafka.annotations import KafkaMessage
from pydantic import TypeAdapter

from contracts.topics import Topic
from services.runtime.platform.deadletter import parse_or_dead_letter, send_to_dead_letter
from services.runtime.platform.kafka import FETCH_WAIT_MS, IDLE_WAKE_MS
from services.runtime.platform.redelivery import Redelivery
from services.runtime.platform.settings import Settings

log = logging.getLogger(__name__)

M = TypeVar("M")
BATCH_TIMEOUT_MS = 500  # FastStream sleeps this long after an empty batch fetch
GATHER_MIN_BYTES = 1024 * 1024  # a gathering subscriber's fetch ends early only with this much


class Seekable(Protocol):
    """What rewinding needs of the consumer (aiokafka's AIOKafkaConsumer)."""

    def assignment(self) -> Collection[TopicPartition]: ...

    def seek(self, partition: TopicPartition, offset: int) -> None: ...


def rewind(consumer: Seekable, records: Sequence[ConsumerRecord[Any, Any]]) -> list[TopicPartition]:
    """Each partition of `records` back to its earliest record (what FastStream's nack does), so
    the next fetch hands them again; the partitions not rewound. A partition no longer assigned
    (a rebalance during the backoff) is the expected case, not an error: its next owner, this
    consumer or another, starts from its committed offset, which is before these records, so
    nothing is skipped. FastStream's own seek raised IllegalStateError there, logged CRITICAL."""
    earliest: dict[TopicPartition, int] = {}
    for record in records:
        tp = TopicPartition(record.topic, record.partition)
        earliest[tp] = min(record.offset, earliest.get(tp, record.offset))
    assigned = consumer.assignment()
    left: list[TopicPartition] = []
    for tp, offset in earliest.items():
        try:
            if tp in assigned:
                consumer.seek(tp, offset)
                continue
        except IllegalStateError:  # taken between the look at the assignment and the seek
            pass
        left.append(tp)
    if left:
        log.info("partitions %s were reassigned while their records waited to be retried: they resume from their commit", left)
    return left


@asynccontextmanager
async def _retried_after_backoff(redelivery: Redelivery, msg: KafkaMessage, topics: Sequence[str] = ()) -> AsyncIterator[None]:
    """An error of the block is handled again after the consumer's backoff: waited out here, then
    the message (or batch) rewound (`rewind`). Raised as `SkipMessage`, FastStream neither logs it
    again (Redelivery logs each attempt once), nor commits, nor seeks again; the cause stays in
    `__cause__`."""
    try:
        yield
    except Exception as exc:
        await asyncio.sleep(redelivery.failed(exc, topics))
        records = msg.raw_message if isinstance(msg.raw_message, tuple) else (msg.raw_message,)
        rewind(msg.consumer, records)  # type: ignore[arg-type]  # FastStream types it as its protocol; it is aiokafka's
        raise SkipMessage() from exc
    redelivery.succeeded()


@dataclass(frozen=True)
class Reading(Generic[M]):
    """How to read one topic: its contract model, and (optionally) rules an event must keep,
    judged against the Kafka record's timestamp in ms (every consumer judges a record alike),
    and a faster decoder tried first (deadletter.parse)."""

    model: type[M] | TypeAdapter[M]
    rules: Callable[[M, int], list[str]] | None = None
    first_pass: Callable[[bytes], M | None] | None = None


@dataclass(frozen=True)
class Subscriber:
    """Where a service's subscribers attach: its router, and what dead-lettering needs."""

    router: KafkaRouter
    broker: KafkaBroker
    settings: Settings

    def each(
        self, topic: Topic, reading: Reading[M], *, group: str, handle: Callable[[M], Awaitable[None]], title: str = ""
    ) -> None:
        """`handle` gets every valid event of `topic`, one at a time, in offset order."""
        redelivery = Redelivery(self.settings.group(group), [self.settings.topic(topic.name)])

        @self.router.subscriber(
            self.settings.topic(topic.name),
            group_id=self.settings.group(group),
            title=title or group,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=FETCH_WAIT_MS,
            consumer_timeout_ms=IDLE_WAKE_MS,
            ack_policy=AckPolicy.NACK_ON_ERROR,
        )
        async def on_message(msg: KafkaMessage) -> None:
            record = msg.raw_message
            assert not isinstance(record, tuple)
            async with _retried_after_backoff(redelivery, msg):
                event = await self._read(topic, reading, record)
                if event is not None:
                    try:
                        await handle(event)
                    except psycopg.DataError as exc:
                        await self._unstorable(topic, record, exc)

    def batches(
        self,
        readings: Mapping[Topic, Reading[Any]],
        *,
        group: str,
        handle: Callable[[list[M]], Awaitable[None]],
        title: str = "",
        max_records: int = 1000,
        batch_timeout_ms: int = BATCH_TIMEOUT_MS,
        gather_ms: int | None = None,
    ) -> None:
        """`handle` gets the valid events of one fetch from any of `readings`' topics, in
        offset order per partition; the whole batch is committed once it returns.

        `gather_ms`: for a subscriber no latency bound waits on, the broker holds each fetch
        this long (or until a megabyte is there) while records flow, so that a trickle is
        handled (and committed) once per `gather_ms`, not once per record. An idle consumer
        still answers its first record at once (fetch_pace.py)."""
        by_name = {self.settings.topic(topic.name): (topic, reading) for topic, reading in readings.items()}
        redelivery = Redelivery(self.settings.group(group), list(by_name))

        @self.router.subscriber(
            *by_name,
            group_id=self.settings.group(group),
            title=title or group,
            auto_offset_reset="earliest",
            batch=True,
            max_records=max_records,
            batch_timeout_ms=max(batch_timeout_ms, gather_ms or 0),
            fetch_max_wait_ms=FETCH_WAIT_MS if gather_ms is None else gather_ms,
            fetch_min_bytes=1 if gather_ms is None else GATHER_MIN_BYTES,
            consumer_timeout_ms=IDLE_WAKE_MS,
            ack_policy=AckPolicy.NACK_ON_ERROR,
        )
        async def on_batch(msg: KafkaMessage) -> None:
            records = msg.raw_message if isinstance(msg.raw_message, tuple) else (msg.raw_message,)
            async with _retried_after_backoff(redelivery, msg, sorted({record.topic for record in records})):
                read: list[tuple[ConsumerRecord[Any, Any], M]] = []
                for record in records:
                    topic, reading = by_name[record.topic]
                    event = await self._read(topic, reading, record)
                    if event is not None:
                        read.append((record, event))
                await handle_storable(read)

        async def handle_storable(read: list[tuple[ConsumerRecord[Any, Any], M]]) -> None:
            """`handle` the events; one the database cannot store is found by halves and dead-lettered."""
            try:
                await handle([event for _, event in read])
            except psycopg.DataError as exc:
                if len(read) == 1:
                    record = read[0][0]
                    await self._unstorable(by_name[record.topic][0], record, exc)
                    return
                if not read:
                    raise
                half = len(read) // 2
                await handle_storable(read[:half])
                await handle_storable(read[half:])

    async def _unstorable(self, topic: Topic, record: ConsumerRecord[Any, Any], exc: psycopg.DataError) -> None:
        error = f"the database cannot store it: {type(exc).__name__}: {exc}"
        await send_to_dead_letter(self.broker, self.settings, topic, record.value, error, key=record.key)

    async def _read(self, topic: Topic, reading: Reading[M], record: ConsumerRecord[Any, Any]) -> M | None:
        if record.value is None:
            return None  # a compacted topic's tombstone
        rules = reading.rules
        timestamp = record.timestamp
        judge = None if rules is None else (lambda event: rules(event, timestamp))
        return await parse_or_dead_letter(
            self.broker,
            self.settings,
            topic,
            reading.model,
            record.value,
            key=record.key,
            rules=judge,
            first_pass=reading.first_pass,
        )
