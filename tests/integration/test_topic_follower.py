"""A TopicFollower's end offsets lookups (at its start, and each `reach_current_end`) on the real
broker: they must not queue behind the fetch its consumer always has in flight."""

import asyncio
import time

import pytest
from aiokafka import AIOKafkaProducer

from contracts.topics import KEYS
from services.runtime.platform import topic_follower
from services.runtime.platform.topic_follower import TopicFollower

pytestmark = pytest.mark.integration
HELD_MS = 5000  # the follower's fetch wait here: a lookup behind its fetch would take this long


async def test_the_end_offsets_lookups_do_not_wait_for_the_followers_held_fetch(settings, monkeypatch):
    # The broker answers one connection's requests in order, and holds a fetch of a read-to-the-end
    # partition for the fetch wait. A long wait makes a lookup on the fetching connection plain to see.
    monkeypatch.setattr(topic_follower, "FETCH_WAIT_MS", HELD_MS)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers)
    await producer.start()
    try:
        await producer.send_and_wait(settings.topic(KEYS.name), b"{}", key=b"k", partition=0)
    finally:
        await producer.stop()
    read: list[bytes | None] = []
    follower = TopicFollower(settings.kafka_bootstrap_servers, {settings.topic(KEYS.name): lambda _k, v: read.append(v)})
    began = time.monotonic()
    await follower.start()
    try:
        started = time.monotonic() - began
        await asyncio.wait_for(follower.caught_up.wait(), 30)
        assert read == [b"{}"]
        await asyncio.sleep(0.5)  # read to the end: its next fetch is in flight, held by the broker
        began = time.monotonic()
        await follower.reach_current_end()
        reached = time.monotonic() - began
    finally:
        await follower.stop()
    assert started < HELD_MS / 2000, started
    assert reached < HELD_MS / 2000, reached
