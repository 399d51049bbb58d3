"""A handler error that is not an unstorable event (a bug on one valid event, Postgres down) is
retried, never dead-lettered, after a backoff that doubles from 0.5 s (redelivery.py): before, the
event came back at once, ~160 times a second, for as long as the error lasted. On the real broker,
through the one subscribe helper, one event at a time and in batches: the event is handled once,
its attempts are spaced by at least the policy's delays, and the failures are on /metrics."""

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from faststream.kafka import KafkaRouter
from prometheus_client import REGISTRY
from pydantic import TypeAdapter

from contracts.topics import AUDIT, Topic, dead_letter
from services.runtime.platform.kafka import ensure_topics, make_broker, start_subscribers
from services.runtime.platform.subscribe import Reading, Subscriber
from tests.support.metering import wait_until
from tests.support.topics import topic_records

pytestmark = pytest.mark.integration

FAILURES = 3
# The policy's shortest waits after failures 1, 2 and 3 (0.5, 1 and 2 s, before jitter).
LEAST_SPACING_S = 0.5 + 1.0 + 2.0


@pytest.mark.parametrize("shape", ["each", "batches"])
async def test_a_failing_handler_is_retried_with_backoff_and_the_event_handled_once(settings, shape):
    await ensure_topics(settings, (AUDIT, dead_letter(AUDIT)))
    group, topic = f"test.redelivery.{shape}", settings.topic(AUDIT.name)
    event_id = str(uuid.uuid4())
    attempts: list[float] = []
    handled: list[str] = []

    async def handle(event: dict[str, Any]) -> None:
        attempts.append(time.monotonic())
        if len(attempts) <= FAILURES:
            raise RuntimeError("a bug on this one valid event")
        handled.append(event["id"])

    async def handle_batch(events: list[dict[str, Any]]) -> None:
        for event in events:
            await handle(event)

    broker = make_broker(settings)
    subscribe = Subscriber(KafkaRouter(), broker, settings)
    reading = Reading(TypeAdapter(dict[str, Any]))
    if shape == "each":
        subscribe.each(AUDIT, reading, group=group, handle=handle)
    else:
        subscribe.batches({AUDIT: reading}, group=group, handle=handle_batch)
    broker.include_router(subscribe.router)
    await start_subscribers(broker)
    try:
        producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(topic, f'{{"id": "{event_id}"}}'.encode())
        finally:
            await producer.stop()

        async def done() -> bool:
            return bool(handled)

        await wait_until(done, timeout=30)
        await asyncio.sleep(1.0)  # nothing more comes: the success was committed
    finally:
        await broker.stop()

    assert handled == [event_id]  # handled once, after its failures
    assert len(attempts) == FAILURES + 1
    # Spaced by the backoff: a hot loop made these attempts within milliseconds.
    assert attempts[-1] - attempts[0] >= LEAST_SPACING_S
    labels = {"group": settings.group(group), "topic": topic}
    assert REGISTRY.get_sample_value("tollgate_consumer_failures_total", labels) == FAILURES
    assert REGISTRY.get_sample_value("tollgate_consumer_consecutive_failures", labels) == 0  # reset by the success
    assert await topic_records(settings.kafka_bootstrap_servers, settings.topic(dead_letter(AUDIT).name)) == []


async def test_a_rebalance_during_the_backoff_is_no_error_and_each_record_is_handled(settings, caplog):
    """A second member joins the group while the first waits out its backoff on a batch of both
    partitions' records: the rebalance takes one partition away, and the nack's seek of it raised
    IllegalStateError inside FastStream, logged CRITICAL (nothing was lost: the new owner starts
    from the commit). Now that partition is left to its new owner (logged at info), the other is
    rewound, and both records are handled."""
    topic = Topic(f"test-rewind-{uuid.uuid4().hex[:8]}.v1", partitions=2)
    await ensure_topics(settings, (topic, dead_letter(topic)))
    group, name = f"test.rewind.{uuid.uuid4().hex[:8]}", settings.topic(topic.name)
    caplog.set_level(logging.INFO)
    handled: dict[str, str] = {}  # event id -> which member
    failures: list[float] = []
    second_handled = asyncio.Event()

    def member(who: str) -> Callable[[list[dict[str, Any]]], Awaitable[None]]:
        async def handle(events: list[dict[str, Any]]) -> None:
            if who == "first" and not second_handled.is_set():
                failures.append(time.monotonic())
                raise RuntimeError("postgres is down")
            handled.update((event["id"], who) for event in events)
            if who == "second":
                second_handled.set()

        return handle

    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
    await producer.start()
    try:
        ids = [str(uuid.uuid4()), str(uuid.uuid4())]
        for partition, event_id in enumerate(ids):
            await producer.send_and_wait(name, f'{{"id": "{event_id}"}}'.encode(), partition=partition)
    finally:
        await producer.stop()

    brokers = []
    try:
        for who in ("first", "second"):
            broker = make_broker(settings)
            subscribe = Subscriber(KafkaRouter(), broker, settings)
            subscribe.batches({topic: Reading(TypeAdapter(dict[str, Any]))}, group=group, handle=member(who))
            broker.include_router(subscribe.router)
            await start_subscribers(broker)
            brokers.append(broker)
            if who == "first":

                async def failing() -> bool:
                    return bool(failures)

                await wait_until(failing, timeout=30)  # the second joins during a backoff

        async def both() -> bool:
            return set(handled) == set(ids)

        await wait_until(both, timeout=60)
    finally:
        for broker in brokers:
            await broker.stop()

    assert set(handled.values()) == {"first", "second"}  # the rebalance gave each a partition
    assert not [r for r in caplog.records if r.levelno >= logging.CRITICAL], [
        r.getMessage() for r in caplog.records if r.levelno >= logging.CRITICAL
    ]
    assert any("resume from their commit" in r.getMessage() for r in caplog.records)
