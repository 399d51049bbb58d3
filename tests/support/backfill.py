"""Backfilled history for the sink's tests: usage and call events dated in the past, and a
producer that writes them with their own times as record timestamps, as a backfill would."""

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

from aiokafka import AIOKafkaProducer

from contracts.common import Resource
from contracts.events import CallEvent, UsageEvent
from services.runtime.platform.settings import Settings

START = datetime(2026, 9, 1, tzinfo=UTC)
RANGE = {"range": "custom", "start": "2026-01-01T00:00:00Z", "end": "2027-01-01T00:00:00Z"}


def usage(account: uuid.UUID, n: int) -> UsageEvent:
    quantity = n % 97 + 3
    return UsageEvent(
        time=START + timedelta(seconds=37 * n),
        account_id=account,
        resource=Resource.AI_TOKENS,
        quantity=quantity,
        provider="openai",
        model="gpt-4o",
        input_tokens=min(n % 89, quantity),  # the split adds up to the quantity (contracts/usage_rules.py)
        output_tokens=quantity - min(n % 89, quantity),
        source="kill-test",
    )


def call(account: uuid.UUID, n: int) -> CallEvent:
    return CallEvent(
        time=START + timedelta(seconds=11 * n),
        account_id=account,
        api_key_id=uuid.UUID(int=n % 3 + 1),
        method="GET",
        path="/api/geo/projects",
        status=200,
        ip="10.0.0.1",
        latency_ms=1.5,
    )


def stamp(event: UsageEvent | CallEvent) -> int:
    """The record timestamp a backfill of history sets: the event's own time (usage.v1's consumers
    judge an event's time against its record's, contracts/usage_rules.py)."""
    return int(event.time.timestamp() * 1000)


async def produce(settings: Settings, records: list[tuple[str, bytes, bytes, int | None]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all", linger_ms=5)
    await producer.start()
    try:
        for i in range(0, len(records), 5000):
            futures = [await producer.send(t, v, key=k, timestamp_ms=ms) for t, k, v, ms in records[i : i + 5000]]
            await asyncio.gather(*futures)
            await asyncio.sleep(0.05)  # a steady stream, so the kill lands while batches are in flight
    finally:
        await producer.stop()
