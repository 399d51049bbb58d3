"""The metered facts outlive the broker's retention check, however old their records' timestamps.

A backfill of history is stamped with its history's time. Kafka's time retention counts from
the record's timestamp, so on a topic kept by time such records are gone at the next check (the
local stack checks every 5 s), and a consumer that was behind skips them silently. usage.v1 and
calls.v1 are kept by size: the same records stay. A topic kept by time is the control: it
shows the check ran while the test waited.
"""

import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from contracts.topics import CALLS, QUOTA_THRESHOLDS, USAGE
from services.runtime.platform.kafka import ensure_topics
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
