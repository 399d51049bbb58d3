"""The sink: usage.v1 and calls.v1 -> ClickHouse in batches, exactly once in effect.

Each topic has its own aiokafka consumer (one consumer group per topic): a batch is whatever
has arrived, up to `MAX_RECORDS` (count) or after `BATCH_TIMEOUT_MS` of waiting (time). Every
raw message is validated against its contract model (`validation.judge`: malformed ones, events
without an id, and usage events that break contracts/usage_rules.py, go to the dead-letter topic
with the error, acknowledged before the batch is written). The valid messages' JSON then goes to
the engine as it came from Kafka (`MeteringStore.insert_*`: dedup by id, one INSERT), and only
then are the batch's offsets committed (`pipeline.WritePipeline`: a batch's write overlaps the
next one's validation and the fetch of the one after). A crash before the commit redelivers the batch, and the dedup turns the
replay into duplicates that are not inserted again.

A plain aiokafka loop rather than a FastStream subscriber: the sink commits, rewinds and drains
on revoke itself, and FastStream's batch parsing builds a headers dict per record that the sink
never reads (BENCHMARKS.md, metering round 4: about 190k events/s with it, 190-290k without).
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import cast

from aiokafka import AIOKafkaConsumer
from prometheus_client import Counter

from contracts.events import CallEvent, Event, UsageEvent
from contracts.topics import CALLS, USAGE, Topic
from contracts.usage_rules import violations_at
from services.edge.component import Runtime
from services.metering.pipeline import RETRY_DELAY_S, DrainOnRevoke, Records, WritePipeline
from services.metering.store import Canonical, InsertResult, MeteringStore
from services.metering.validation import Rules, judge
from services.runtime.platform.deadletter import send_to_dead_letter

log = logging.getLogger(__name__)

# Large batches: the engine's cost per INSERT is mostly fixed (10k: 4.4 us/event, 50k: 2.6).
MAX_RECORDS = 50_000
BATCH_TIMEOUT_MS = 100

SINK_EVENTS = Counter("tollgate_metering_sink_events_total", "Events handled by the metering sink", ["topic", "outcome"])

Insert = Callable[[list[bytes], Canonical], Awaitable[InsertResult]]
RulesOf = Callable[[Records], Rules]


def _usage_rules(records: Records) -> Rules:
    """usage.v1's rules (contracts/usage_rules.py), each event judged against its own record's
    timestamp: every consumer, at any replay, judges a record the same way."""

    def rules(i: int, event: Event) -> str | None:
        broken = violations_at(cast(UsageEvent, event), records[i].timestamp * 1000)  # ms -> us; judge parsed a UsageEvent
        return "; ".join(broken) if broken else None

    return rules


def canonical(model: type[Event]) -> Canonical:
    return lambda line: model.model_validate_json(line).model_dump_json().encode()


class TopicSink:
    """One topic's consumer: fetches batches and hands them to its write pipeline."""

    def __init__(self, runtime: Runtime, topic: Topic, group: str, pipeline: WritePipeline) -> None:
        self.topic = runtime.settings.topic(topic.name)
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
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=8 * 1024 * 1024,
        )
        consumer.subscribe([self.topic], listener=DrainOnRevoke(self.pipeline))
        await consumer.start()
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
        fetched = await consumer.getmany(timeout_ms=BATCH_TIMEOUT_MS, max_records=MAX_RECORDS)
        epoch = self.pipeline.epoch  # before any await: the batch belongs to this assignment
        if fetched:
            await self.pipeline.submit(consumer, fetched, epoch)

    async def _rejoin(self) -> AIOKafkaConsumer:
        while True:
            await asyncio.sleep(RETRY_DELAY_S)
            try:
                return await self._join()
            except Exception:
                log.warning("metering sink: cannot join %s yet; retrying", self.group, exc_info=True)


class Sink:
    def __init__(self, runtime: Runtime, store: MeteringStore) -> None:
        self._runtime = runtime
        self.topics = [
            self._topic_sink(USAGE, "metering.usage", UsageEvent, store.insert_usage, _usage_rules),
            self._topic_sink(CALLS, "metering.calls", CallEvent, store.insert_calls, None),
        ]

    async def start(self) -> None:
        for topic in self.topics:
            await topic.start()

    async def close(self) -> None:
        """Before the process stops: finish and commit the writes in flight, start no other."""
        await asyncio.gather(*(topic.close() for topic in self.topics))

    def _topic_sink(self, topic: Topic, group: str, model: type[Event], insert: Insert, rules_of: RulesOf | None) -> TopicSink:
        runtime, settings = self._runtime, self._runtime.settings
        to_canonical = canonical(model)

        async def prepare(records: Records) -> list[bytes]:
            values = [record.value or b"" for record in records]
            verdict = judge(model, values, rules_of(records) if rules_of is not None else None)
            if verdict.rejected:
                await asyncio.gather(
                    *(
                        send_to_dead_letter(runtime.broker, settings, topic, values[i], error, key=records[i].key)
                        for i, error in verdict.rejected
                    )
                )
                SINK_EVENTS.labels(topic.name, "dead_lettered").inc(len(verdict.rejected))
            return verdict.lines(values)

        async def write(lines: list[bytes]) -> None:
            result = await insert(lines, to_canonical)
            SINK_EVENTS.labels(topic.name, "inserted").inc(result.inserted)
            SINK_EVENTS.labels(topic.name, "duplicate").inc(result.duplicates)

        return TopicSink(runtime, topic, group, WritePipeline(prepare, write))
