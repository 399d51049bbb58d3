"""A topic handed from one consumer group to another on a real broker
(services/runtime/platform/group_handover.py): the new group starts where the old one left off,
the old group's offsets on the topic are deleted (no lag left behind for ever), a second start
changes nothing, and while a member of the old group still reads the topic the delete waits for
it to stop."""

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from contracts.topics import Topic
from services.runtime.platform.group_handover import GroupHandover, commit_offsets
from services.runtime.platform.kafka import ensure_topics
from tests.support.metering import wait_until

pytestmark = pytest.mark.integration


async def _topic_with_records(settings, records: int) -> str:
    topic = Topic(f"handover-{uuid.uuid4().hex[:8]}.v1", partitions=2)
    await ensure_topics(settings, (topic,))
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers)
    await producer.start()
    try:
        for i in range(records):
            await producer.send_and_wait(settings.topic(topic.name), b"x", partition=i % 2)
    finally:
        await producer.stop()
    return settings.topic(topic.name)


async def _commit(settings, group: str, offsets: dict[TopicPartition, int]) -> None:
    await commit_offsets(settings.kafka_bootstrap_servers, group, offsets)


async def _committed(settings, group: str, topic: str) -> dict[TopicPartition, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp: meta.offset for tp, meta in offsets.items() if tp.topic == topic and meta.offset >= 0}


async def test_the_new_group_starts_where_the_old_one_left_off_and_the_old_offsets_go(settings):
    topic = await _topic_with_records(settings, 10)
    old, new = settings.group(f"old-{uuid.uuid4().hex[:6]}"), settings.group(f"new-{uuid.uuid4().hex[:6]}")
    left_off = {TopicPartition(topic, 0): 4, TopicPartition(topic, 1): 3}
    await _commit(settings, old, left_off)

    handover = GroupHandover(settings.kafka_bootstrap_servers, topic, old, new)
    assert await handover.hand_over() is False  # nothing pending: the old offsets are gone
    assert await _committed(settings, new, topic) == left_off
    assert await _committed(settings, old, topic) == {}

    # A second start (every later one) keeps the new group's own progress.
    progressed = {TopicPartition(topic, 0): 5, TopicPartition(topic, 1): 5}
    await _commit(settings, new, progressed)
    await _commit(settings, old, {TopicPartition(topic, 0): 1})  # e.g. a rolled-back replica read a little
    assert await handover.hand_over() is False
    assert await _committed(settings, new, topic) == progressed
    assert await _committed(settings, old, topic) == {}


async def test_a_first_deployment_has_nothing_to_hand_over(settings):
    topic = await _topic_with_records(settings, 2)
    old, new = settings.group(f"old-{uuid.uuid4().hex[:6]}"), settings.group(f"new-{uuid.uuid4().hex[:6]}")
    assert await GroupHandover(settings.kafka_bootstrap_servers, topic, old, new).hand_over() is False
    assert await _committed(settings, new, topic) == {}  # the subscriber reads from the earliest offset


async def test_the_old_offsets_are_deleted_once_the_last_old_reader_stops(settings):
    topic = await _topic_with_records(settings, 6)
    old, new = settings.group(f"old-{uuid.uuid4().hex[:6]}"), settings.group(f"new-{uuid.uuid4().hex[:6]}")
    # A replica of the previous version, still reading the topic in the old group.
    reader = AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.kafka_bootstrap_servers,
        group_id=old,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await reader.start()
    try:
        while sum(len(batch) for batch in (await reader.getmany(timeout_ms=1000)).values()) == 0:
            pass
        await reader.commit()
        left_off = await _committed(settings, old, topic)
        assert left_off

        handover = GroupHandover(settings.kafka_bootstrap_servers, topic, old, new, retry_s=0.2)
        await handover.start()
        try:
            assert await _committed(settings, new, topic) == left_off  # handed over at once
            await asyncio.sleep(0.6)
            assert await _committed(settings, old, topic) == left_off  # not deleted under a reader
            await reader.stop()

            async def deleted() -> bool:
                return not await _committed(settings, old, topic)

            await wait_until(deleted, timeout=30)
            assert handover._retrying is not None and handover._retrying.done()
        finally:
            await handover.close()
    finally:
        await reader.stop()
