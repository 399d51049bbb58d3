"""The sink: usage.v1 and calls.v1 -> ClickHouse in batches, exactly once in effect.

Each subscriber is a FastStream batch consumer (one consumer group per topic): a batch is
whatever arrived, up to `max_records` (count) or after `batch_timeout_ms` of waiting (time).
Per batch: parse (malformed -> dead-letter topic with the error), drop ids already written
(one lookup in ClickHouse per batch), insert the rest in one INSERT, and only then commit
the offsets (AckPolicy.NACK_ON_ERROR: commit after the handler returns; on an error seek back
so the batch is redelivered). A crash before the commit redelivers the batch, and the id
lookup turns the replay into duplicates that are not inserted again.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from faststream import AckPolicy
from faststream.kafka import KafkaMessage, KafkaRouter
from faststream.message import StreamMessage
from prometheus_client import Counter
from pydantic import BaseModel

from contracts.events import CallEvent, UsageEvent
from contracts.topics import CALLS, USAGE, Topic
from services.metering.store import InsertResult, MeteringStore
from services.runtime.component import Runtime
from services.runtime.deadletter import send_to_dead_letter

log = logging.getLogger(__name__)

MAX_RECORDS = 10_000
BATCH_TIMEOUT_MS = 100

M = TypeVar("M", bound=BaseModel)
SINK_EVENTS = Counter("tollgate_metering_sink_events_total", "Events handled by the metering sink", ["topic", "outcome"])


async def _raw_values(msg: StreamMessage[Any]) -> Any:
    """Skip FastStream's per-message JSON decoding: the handler validates the raw bytes itself."""
    return [record.value for record in msg.raw_message]


def split_valid(validate: Callable[[bytes], M], records: Sequence[Any]) -> tuple[list[M], list[tuple[Any, str]]]:
    """Validate each raw message once, in one tight loop (the sink's hot path: no await and no
    per-message dispatch); returns the events and the (record, error) of the malformed ones."""
    events: list[M] = []
    rejected: list[tuple[Any, str]] = []
    for record in records:
        try:
            events.append(validate(record.value or b""))
        except ValueError as exc:  # pydantic's ValidationError is a ValueError; so is bad JSON
            rejected.append((record, str(exc)))
    return events, rejected


async def _parse_batch(runtime: Runtime, topic: Topic, model: type[M], msg: KafkaMessage) -> list[M]:
    events, rejected = split_valid(model.model_validate_json, msg.raw_message)
    if rejected:
        # Published concurrently, but all acknowledged before the handler returns: the offsets
        # are committed only after every malformed message is safe in the dead-letter topic.
        await asyncio.gather(
            *(
                send_to_dead_letter(runtime.broker, runtime.settings, topic, r.value or b"", error, key=r.key)
                for r, error in rejected
            )
        )
        SINK_EVENTS.labels(topic.name, "dead_lettered").inc(len(rejected))
    return events


def _count(topic: Topic, result: InsertResult) -> None:
    SINK_EVENTS.labels(topic.name, "inserted").inc(result.inserted)
    SINK_EVENTS.labels(topic.name, "duplicate").inc(result.duplicates)


def build_sink(runtime: Runtime, store: MeteringStore) -> KafkaRouter:
    router = KafkaRouter()
    _subscribe_sink(router, runtime, USAGE, "metering.usage", UsageEvent, store.insert_usage)
    _subscribe_sink(router, runtime, CALLS, "metering.calls", CallEvent, store.insert_calls)
    return router


def _subscribe_sink(
    router: KafkaRouter,
    runtime: Runtime,
    topic: Topic,
    group: str,
    model: type[M],
    insert: Callable[[list[M]], Awaitable[InsertResult]],
) -> None:
    settings = runtime.settings

    async def sink(body: Any, msg: KafkaMessage) -> None:
        events = await _parse_batch(runtime, topic, model, msg)
        if events:
            _count(topic, await insert(events))

    router.subscriber(
        settings.topic(topic.name),
        group_id=settings.group(group),
        batch=True,
        max_records=MAX_RECORDS,
        batch_timeout_ms=BATCH_TIMEOUT_MS,
        auto_offset_reset="earliest",
        ack_policy=AckPolicy.NACK_ON_ERROR,
        decoder=_raw_values,
        max_partition_fetch_bytes=8 * 1024 * 1024,
        title=f"sink:{topic.name}",
    )(sink)
