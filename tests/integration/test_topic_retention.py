"""The metered facts outlive the broker's retention check, however old their records' timestamps,
and records Kafka deleted before the sink read them are counted as lost, never skipped in silence.

A backfill of history is stamped with its history's time. Kafka's time retention counts from
the record's timestamp, so on a topic kept by time such records are gone at the next check (the
local stack checks every 5 s), and a consumer that was behind skips them silently. usage.v1 and
calls.v1 are kept by size: the same records stay. A topic kept by time is the control: it
shows the check ran while the test waited.
"""

import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.structs import OffsetAndMetadata

from contracts.topics import CALLS, METERED, QUOTA_THRESHOLDS, USAGE
from services.metering.consumers import SINK_EVENTS
from services.runtime.platform import clickhouse
from services.runtime.platform.kafka import ensure_topics
from tests.support.apps import running_app
from tests.support.backfill import stamp, usage
from tests.support.metering import wait_until

pytestmark = pytest.mark.integration

EIGHTY_DAYS_AGO_MS = int((time.time() - 80 * 86_400) * 1000)


async def test_records_stamped_long_ago_stay_on_the_metered_topics(settings):
    await ensure_topics(settings, (USAGE, CALLS, QUOTA_THRESHOLDS))
    metered = [TopicPartition(settings.topic(t.name), 0) for t in (USAGE, CALLS)]
    control = TopicPartition(settings.topic(QUOTA_THRESHOLDS.name), 0)  # kept by time (the default 7 days)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
    await producer.start()
    try:
        for tp in [*metered, control]:
            for n in range(10):
                await producer.send_and_wait(tp.topic, b"{}", partition=tp.partition, timestamp_ms=EIGHTY_DAYS_AGO_MS + n)
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap_servers)
    await consumer.start()
    try:

        async def control_trimmed() -> bool:
            return (await consumer.beginning_offsets([control]))[control] > 0

        await wait_until(control_trimmed, timeout=60, interval=0.5)
        assert await consumer.beginning_offsets(metered) == {tp: 0 for tp in metered}
        assert await consumer.end_offsets(metered) == {tp: 10 for tp in metered}
    finally:
        await consumer.stop()


async def test_a_metered_topic_an_older_version_made_is_brought_to_size_retention_keeping_other_settings(settings):
    settings = settings.model_copy(update={"topic_prefix": f"{settings.topic_prefix}old."})  # topics not made yet
    topic = settings.topic(USAGE.name)
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
    await admin.start()
    try:

        async def overrides() -> dict[str, str]:  # the configs set on the topic itself
            [response] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
            [(_, _, _, _, entries)] = response.resources
            return {entry[0]: entry[1] for entry in entries if entry[3] == 1}

        # as v1 made it (kept by time), with a setting of the operator's own
        await admin.create_topics([NewTopic(topic, USAGE.partitions, 1, topic_configs={"max.message.bytes": "2000000"})])

        async def described() -> bool:  # a topic just made may be described only a moment later
            return "max.message.bytes" in await overrides()

        await wait_until(described, timeout=15, interval=0.1)
        await ensure_topics(settings, (USAGE,))

        wanted = {**METERED, "max.message.bytes": "2000000"}

        async def updated() -> bool:  # a broker applies a config change from the metadata log: soon, not at once
            return await overrides() == wanted

        try:
            await wait_until(updated, timeout=15, interval=0.2)
        except TimeoutError:
            assert await overrides() == wanted
    finally:
        await admin.close()


async def test_the_sink_counts_records_deleted_before_it_read_them_and_goes_on(settings):
    """Partition 0: the group had read 3 records when Kafka deleted the first 6 (3 lost).
    Partition 1: the group never read it (it starts at the oldest record kept: none lost)."""
    await ensure_topics(settings, (USAGE,))
    topic, group = settings.topic(USAGE.name), settings.group("metering.usage")
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    events = [usage(uuid.uuid4(), n) for n in range(20)]
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
    await producer.start()
    try:
        for n, event in enumerate(events):
            await producer.send_and_wait(topic, event.model_dump_json().encode(), partition=n // 10, timestamp_ms=stamp(event))
    finally:
        await producer.stop()
    reader = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap_servers, group_id=group, enable_auto_commit=False)
    await reader.start()
    try:
        reader.assign([p0])
        await reader.commit({p0: OffsetAndMetadata(3, "")})
    finally:
        await reader.stop()
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
    await admin.start()
    try:
        await admin.delete_records({p0: RecordsToDelete(6), p1: RecordsToDelete(6)})
    finally:
        await admin.close()

    lost_before = SINK_EVENTS.labels(USAGE.name, "lost")._value.get()
    table = f"{settings.clickhouse_database}.usage_events"
    async with running_app(settings, targets=("metering",)):  # started: its tables exist
        ch = clickhouse.connect(settings.clickhouse_dsn)
        kept = sorted(str(e.id) for e in events[6:10] + events[16:])

        async def all_kept_written() -> bool:
            return sorted(str(row[0]) for row in ch.query(f"SELECT id FROM {table}").result_rows) == kept

        try:
            await wait_until(all_kept_written, timeout=60, interval=0.2)
        finally:
            ch.close()
    assert SINK_EVENTS.labels(USAGE.name, "lost")._value.get() - lost_before == 3
