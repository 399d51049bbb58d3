"""The sink: usage.v1 and calls.v1 -> ClickHouse in batches, exactly once in effect.

Each topic has its own aiokafka consumer (one consumer group per topic): a batch is whatever
has arrived, up to `MAX_RECORDS` (`getmany` returns as soon as there is any). The use
case is `ingest.SinkWrite`: every raw message is validated against its contract model (malformed
ones, events without an id, usage events that break contracts/usage_rules.py and call events that
break its time rule go to the dead-letter topic with the error, acknowledged before the batch is
written); the valid messages' JSON then goes to the engine as it came from Kafka
(`MeteringStore.insert_*`: dedup by id, one INSERT, or one per group of months for a backfill
spanning more partitions than one INSERT may touch), and only then are the batch's offsets
committed (`pipeline.WritePipeline`: a batch's write overlaps the next one's validation and the
fetch of the one after). A crash before the commit redelivers the batch, and the dedup turns the
replay into duplicates that are not inserted again.

A plain aiokafka loop rather than a FastStream subscriber: the sink commits, rewinds and drains
on revoke itself, and FastStream's batch parsing builds a headers dict per record that the sink
never reads: measurably slower (BENCHMARKS.md, metering round 4).
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import NoOffsetForPartitionError, OffsetOutOfRangeError
from prometheus_client import Counter, Histogram

from contracts.events import CallEvent, UsageEvent
from contracts.topics import CALLS, USAGE, Topic
from services.edge import Runtime
from services.metering.ingest import AllowedModels, Prepared, SinkWrite, call_rules, model_flag, usage_rules
from services.metering.pipeline import RETRY_DELAY_S, DrainOnRevoke, Records, WritePipeline
from services.metering.store import MeteringStore
from services.metering.validation import DEAD_LETTER_REASONS
from services.runtime.platform.deadletter import send_to_dead_letter
from services.runtime.platform.kafka import IDLE_WAKE_MS, adapt_started
from services.runtime.platform.metrics import DEPENDENCY_ERRORS
from services.runtime.platform.redelivery import Redelivery

log = logging.getLogger(__name__)

# Large batches: the engine's cost per INSERT is mostly fixed (BENCHMARKS.md, metering round 3).
MAX_RECORDS = 50_000
# The broker holds a fetch until this much has arrived or FETCH_WAIT_MS is up: at a few hundred
# calls a second the sink wrote a handful of events per batch, eight statements each (one
# since), and the engine's fixed cost per statement was a fifth of the stack's CPU per metered
# call (BENCHMARKS.md, "http_load"). At low rates an event becomes visible up to that wait later:
# analytics promise p99 <= 1 s (docs/architecture.md), and each batch is a MergeTree part, its
# projection's and the merges that follow (~20 ms of the server's CPU: a lonely call's largest
# share at 250 ms; BENCHMARKS.md, "http_load" rounds 17 and 20).
FETCH_MIN_BYTES = 1024 * 1024
FETCH_WAIT_MS = 750
IDLE_WAIT_MS = 2000  # how long `getmany` waits when nothing arrives; records end the wait at once

SINK_EVENTS = Counter(
    "tollgate_metering_sink_events_total",
    "Events handled by the metering sink, by topic and outcome (unit: events)",
    ["topic", "outcome"],
)
SINK_OUTCOMES = ("inserted", "duplicate", "dead_lettered", "lost")
SINK_DEAD_LETTERED = Counter(
    "tollgate_metering_sink_dead_lettered_total",
    "Events the metering sink sent to the dead-letter topic, by topic and reason (unit: events)",
    ["topic", "reason"],
)
SINK_BATCH = Histogram(
    "tollgate_metering_sink_batch_events",
    "Events in each batch the metering sink wrote to ClickHouse, by topic (unit: events)",
    ["topic"],
    buckets=(1, 10, 100, 1_000, 5_000, 10_000, 25_000, 50_000, 100_000),
)
SINK_INSERT = Histogram(
    "tollgate_metering_sink_insert_seconds",
    "Duration of each batch's write to ClickHouse (deduplication and INSERT), by topic (unit: seconds)",
    ["topic"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
SINK_WRITE_FAILURES = Counter(
    "tollgate_metering_sink_write_failures_total",
    "Batches whose write to ClickHouse failed and is retried, by topic (unit: batches)",
    ["topic"],
)


class TopicSink:
    """One topic's consumer: fetches batches and hands them to its write pipeline."""

    def __init__(self, runtime: Runtime, topic: Topic, group: str, pipeline: WritePipeline[Prepared]) -> None:
        self.topic = runtime.settings.topic(topic.name)
        self.topic_name = topic.name
        self.group = runtime.settings.group(group)
        self.pipeline = pipeline
        self._bootstrap = runtime.settings.kafka_bootstrap_servers
        self._task: asyncio.Task[None] | None = None
        self.consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        consumer = await self._join()  # at start-up a broker that cannot be reached fails the start
        self._task = asyncio.create_task(self._consume(consumer), name=f"sink:{self.topic}")

    async def close(self) -> None:
        """Finish and commit the write in flight, start no other, and leave the group."""
        await self.pipeline.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _join(self) -> AIOKafkaConsumer:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            group_id=self.group,
            client_id="tollgate-metering-sink",
            enable_auto_commit=False,  # the pipeline commits each batch's own offsets after its write
            # Not "earliest": that would also skip, without a word, records Kafka deleted before
            # this group read them. The sink starts a new group at the beginning and counts a gap.
            auto_offset_reset="none",
            max_partition_fetch_bytes=8 * 1024 * 1024,
            fetch_min_bytes=FETCH_MIN_BYTES,
            fetch_max_wait_ms=FETCH_WAIT_MS,
            consumer_timeout_ms=IDLE_WAKE_MS,
        )
        consumer.subscribe([self.topic], listener=DrainOnRevoke(self.pipeline))
        await consumer.start()
        adapt_started(consumer)  # idle: one long fetch instead of four a second; offset lookups follow a moved leader
        self.consumer = consumer
        return consumer

    async def _consume(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            try:
                while True:
                    await self._hand_on_next_batch(consumer)
            except Exception:
                log.exception("metering sink: consuming %s failed; joining again from the committed offsets", self.topic)
            finally:
                # What was fetched and not committed is fetched again by whoever owns it next.
                self.pipeline.revoked()
                await self.pipeline.drain()
                await consumer.stop()
            consumer = await self._rejoin()

    async def _hand_on_next_batch(self, consumer: AIOKafkaConsumer) -> None:
        # A call of its own, so the records are not kept alive (by a loop variable) during the next fetch.
        try:
            fetched = await consumer.getmany(timeout_ms=IDLE_WAIT_MS, max_records=MAX_RECORDS)
        except NoOffsetForPartitionError as new:  # the group's first read of this partition
            await consumer.seek_to_beginning(new.args[0])
            return
        except OffsetOutOfRangeError as gone:
            await self._skip_deleted(consumer, gone.args[0])
            return
        epoch = self.pipeline.epoch  # before any await: the batch belongs to this assignment
        if fetched:
            await self.pipeline.submit(consumer, fetched, epoch)

    async def _skip_deleted(self, consumer: AIOKafkaConsumer, positions: dict[TopicPartition, int]) -> None:
        """Kafka no longer has the records at these positions (its retention deleted them unread, or
        the partition was truncated). Nothing can bring them back: count them as lost, loudly, and
        go on from the oldest record kept (re-reading some is harmless: the write de-duplicates)."""
        oldest = await consumer.beginning_offsets(list(positions))
        for tp, position in positions.items():
            lost = oldest[tp] - position
            if lost > 0:
                SINK_EVENTS.labels(self.topic_name, "lost").inc(lost)
                log.error(
                    "metering sink: Kafka deleted %d records of %s before they were read (offsets %d-%d)",
                    lost,
                    tp,
                    position,
                    oldest[tp] - 1,
                )
        await consumer.seek_to_beginning(*positions)

    async def _rejoin(self) -> AIOKafkaConsumer:
        while True:
            await asyncio.sleep(RETRY_DELAY_S)
            try:
                return await self._join()
            except Exception:
                log.warning("metering sink: cannot join %s yet; retrying", self.group, exc_info=True)


class Sink:
    """(v4) Usage events are judged against the keys' allowed models (`allowed_models`, from the
    keys.v1 projection) once `keys_ready` says that projection has read its topic to the end."""

    def __init__(
        self, runtime: Runtime, store: MeteringStore, allowed_models: AllowedModels, keys_ready: Callable[[], Awaitable[object]]
    ) -> None:
        self._runtime = runtime
        self.allowed_models = allowed_models

        async def dead_letter(topic: Topic, raw: bytes, error: str, key: bytes | None) -> None:
            await send_to_dead_letter(runtime.broker, runtime.settings, topic, raw, error, key=key)

        self.topics = [
            self._topic_sink(
                SinkWrite(
                    USAGE, UsageEvent, store.insert_usage, dead_letter, usage_rules, model_flag(allowed_models), keys_ready
                ),
                "metering.usage",
            ),
            self._topic_sink(SinkWrite(CALLS, CallEvent, store.insert_calls, dead_letter, call_rules), "metering.calls"),
        ]

    async def start(self) -> None:
        # At once: each start waits for its group's first assignment (kafka.start_subscribers).
        await asyncio.gather(*(topic.start() for topic in self.topics))

    async def close(self) -> None:
        """Before the process stops: finish and commit the writes in flight, start no other."""
        await asyncio.gather(*(topic.close() for topic in self.topics))

    def _topic_sink(self, use_case: SinkWrite, group: str) -> TopicSink:
        name = use_case.topic.name
        for outcome in SINK_OUTCOMES:  # on /metrics at 0 from the start, so an alert can watch `lost`
            SINK_EVENTS.labels(name, outcome)
        for reason in DEAD_LETTER_REASONS:
            SINK_DEAD_LETTERED.labels(name, reason)
        SINK_WRITE_FAILURES.labels(name)
        batch_size, insert_seconds = SINK_BATCH.labels(name), SINK_INSERT.labels(name)

        async def prepare(records: Records) -> Prepared:
            prepared = await use_case.prepare(records)
            if prepared.dead_lettered:
                SINK_EVENTS.labels(name, "dead_lettered").inc(prepared.dead_lettered)
                for reason, count in prepared.reasons.items():
                    SINK_DEAD_LETTERED.labels(name, reason).inc(count)
            return prepared

        async def write(prepared: Prepared) -> None:
            lines = prepared.lines
            started = time.perf_counter()
            try:
                result = await use_case.write(lines, prepared.flagged)
            except Exception:
                SINK_WRITE_FAILURES.labels(name).inc()
                DEPENDENCY_ERRORS.labels("clickhouse").inc()
                raise
            insert_seconds.observe(time.perf_counter() - started)
            batch_size.observe(len(lines))
            SINK_EVENTS.labels(name, "inserted").inc(result.inserted)
            SINK_EVENTS.labels(name, "duplicate").inc(result.duplicates)

        settings = self._runtime.settings
        redelivery = Redelivery(settings.group(group), [settings.topic(name)])
        return TopicSink(self._runtime, use_case.topic, group, WritePipeline(prepare, write, redelivery))
