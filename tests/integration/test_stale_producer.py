"""A producer whose sequence numbers Kafka refuses is replaced, on every kind of producer.

The stale state is what aiokafka is left in after a batch expired with its sequence numbers taken
(a partition without a leader longer than the request timeout): here it is made directly, by
moving the producer's next sequence number on, so real Kafka answers OutOfOrderSequenceNumber.
Without the replacement every later send to that partition fails the same way."""

import asyncio
import contextlib
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import OutOfOrderSequenceNumber

from contracts.topics import CALLS, KEYS, Topic
from services.edge.calls import Call, CallRecorder
from services.runtime.platform.kafka import ensure_topics, make_broker
from services.runtime.platform.outbox_relay import OutboxRelay
from services.runtime.platform.settings import Settings
from tests.support.metering import wait_until

pytestmark = pytest.mark.integration


def _make_stale(producer: AIOKafkaProducer, topic: str) -> None:
    """Skip sequence numbers on every partition of `topic`, as an expired batch does."""
    for partition in producer._metadata.partitions_for_topic(topic):
        producer._txn_manager.increment_sequence_number(TopicPartition(topic, partition), 5)


async def _values(settings: Settings, topic: str, expected: int) -> list[bytes]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=settings.kafka_bootstrap_servers, auto_offset_reset="earliest")
    await consumer.start()
    seen: list[bytes] = []
    try:
        deadline = time.monotonic() + 15
        while len(seen) < expected and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                seen += [r.value or b"" for r in records]
    finally:
        await consumer.stop()
    return seen


async def test_the_outbox_relay_replaces_a_refused_producer_and_sends_the_rows_again_in_order(settings, pool):
    await ensure_topics(settings, (KEYS,))
    topic = settings.topic(KEYS.name)
    relay = OutboxRelay(pool, settings, "keys")
    await relay.start()
    try:

        async def add(value: bytes) -> None:
            async with pool.connection() as conn:
                await relay.add(conn, KEYS, b"k", value)

        async def replaced() -> bool:
            return relay._producer is not stale

        await add(b"1")
        await relay.flush()
        assert relay._producer is not None
        stale = relay._producer
        _make_stale(stale, topic)
        await add(b"2")  # woken by the commit, the relay's pass (or this flush) is refused
        with contextlib.suppress(OutOfOrderSequenceNumber):
            await relay.flush()
        await wait_until(replaced, timeout=10, interval=0.05)
        await add(b"3")
        await relay.flush()
    finally:
        await relay.stop()
    assert await _values(settings, topic, 3) == [b"1", b"2", b"3"]  # row 2, unsent, went again before row 3


async def test_the_broker_replaces_a_refused_producer(settings):
    plain = Topic(f"stale-{uuid.uuid4().hex[:8]}", 2)
    await ensure_topics(settings, (plain,))
    topic = settings.topic(plain.name)
    broker = make_broker(settings)
    await broker.start()
    try:
        await broker.publish(b"1", topic, key=b"k")
        fast: Any = broker.config.producer
        stale = fast._producer.producer
        _make_stale(stale, topic)
        with pytest.raises(OutOfOrderSequenceNumber):
            await broker.publish(b"2", topic, key=b"k")
        assert fast._producer.producer is not stale
        await broker.publish(b"2", topic, key=b"k")  # the caller sends again: it goes
    finally:
        await broker.stop()
    assert await _values(settings, topic, 2) == [b"1", b"2"]


async def test_the_call_recorder_replaces_a_refused_producer_and_sends_the_calls_again(settings):
    await ensure_topics(settings, (CALLS,))
    topic = settings.topic(CALLS.name)
    recorder = CallRecorder(settings, linger_s=0, retry_s=(0.01, 0.05))
    await recorder.start()
    account = uuid.uuid4()

    def record(n: int) -> None:
        assert recorder.reserve()
        recorder.record(Call(datetime.now(UTC), account, uuid.uuid4(), "GET", "/p", 200, "192.0.2.1", "t", float(n)))

    try:
        record(1)
        await asyncio.sleep(0.5)
        assert recorder._producer is not None
        stale = recorder._producer
        _make_stale(stale, topic)
        record(2)

        async def replaced() -> bool:
            return recorder._producer is not stale

        await wait_until(replaced, timeout=10, interval=0.05)
    finally:
        await recorder.stop()  # drains what is left: call 2, through the new producer
    assert len(await _values(settings, topic, 2)) == 2
