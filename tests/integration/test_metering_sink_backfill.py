"""A backfill of years through the metering sink, on real Kafka and ClickHouse (issue 41, item 5).

The tables are partitioned by month, and the engine refuses an INSERT that touches more than
100 partitions (code 252). One batch of usage or call events spanning more months used to fail
the same way at every retry: the sink rewound once a second forever and wrote nothing after it.
Now such a batch is written whole (in several INSERTs) and the sink goes on; and call events keep
the usage rules' time window, so 101 calls.v1 records of a producer with a broken clock over 101
months go to calls.v1.dlq with the reason, and the sink goes on.

Everything is produced before the sink starts, so its first fetch holds it all in one batch.
"""

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from contracts.common import Resource
from contracts.events import CallEvent, UsageEvent
from contracts.topics import CALLS, USAGE, Topic, dead_letter
from services.metering.store import MeteringStore
from services.runtime.host.app import create_app
from services.runtime.platform.kafka import ensure_topics
from services.runtime.platform.settings import Settings
from tests.support.metering import wait_until

pytestmark = pytest.mark.integration

NOW = datetime.now(UTC)
MONTHS = 130


def months_back(k: int) -> datetime:
    """The 15th, noon, of the month k months before the current one."""
    year, month = divmod(NOW.year * 12 + NOW.month - 1 - k, 12)
    return datetime(year, month + 1, 15, 12, tzinfo=UTC)


def usage(account: uuid.UUID, time: datetime) -> UsageEvent:
    return UsageEvent(time=time, account_id=account, resource=Resource.AI_TOKENS, quantity=3, source="backfill-test")


def call(account: uuid.UUID, time: datetime) -> CallEvent:
    key = uuid.uuid4()
    return CallEvent(time=time, account_id=account, api_key_id=key, method="GET", path="/p", status=200, ip="::1", latency_ms=1)


def stamped(event: UsageEvent | CallEvent) -> tuple[UsageEvent | CallEvent, int | None]:
    """A backfill's record: stamped with its event's own time (contracts/usage_rules.py)."""
    return event, int(event.time.timestamp() * 1000)


async def produce(settings: Settings, topic: Topic, records: list[tuple[UsageEvent | CallEvent, int | None]]) -> None:
    """In order, on one partition (one account): the sink reads them in this order."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all", linger_ms=5)
    await producer.start()
    try:
        name = settings.topic(topic.name)
        sent = [
            await producer.send(name, e.model_dump_json().encode(), key=str(e.account_id).encode(), timestamp_ms=ms)
            for e, ms in records
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


@asynccontextmanager
async def sink_running(settings: Settings) -> AsyncIterator[Callable[[str], Awaitable[int]]]:
    """The metering service (its sink) running, and a count of the test database's rows."""
    store = MeteringStore(settings.clickhouse_dsn, settings.clickhouse_database)
    await asyncio.to_thread(store.open)

    async def count(sql: str) -> int:
        rows = await store.reader.run(lambda c: c.query(sql.format(db=settings.clickhouse_database)).result_rows)
        return int(rows[0][0])

    app = create_app(["metering"], settings)
    try:
        async with app.router.lifespan_context(app):
            yield count
    finally:
        await asyncio.to_thread(store.close)


async def committed_to_the_end(settings: Settings, topic: Topic, group: str) -> bool:
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap_servers, group_id=settings.group(group))
    await consumer.start()
    try:
        tps = [TopicPartition(settings.topic(topic.name), p) for p in range(topic.partitions)]
        ends = await consumer.end_offsets(tps)
        return all([(await consumer.committed(tp) or 0) == ends[tp] for tp in tps])
    finally:
        await consumer.stop()


async def dead_letters(settings: Settings, topic: Topic) -> list[tuple[str, str]]:
    """(event id, reason) of every record of `topic`'s dead-letter topic."""
    name = settings.topic(dead_letter(topic).name)
    consumer = AIOKafkaConsumer(name, bootstrap_servers=settings.kafka_bootstrap_servers, auto_offset_reset="earliest")
    await consumer.start()
    try:
        found = []
        while batches := await consumer.getmany(timeout_ms=1500):
            found += [
                (json.loads(r.value)["id"], dict(r.headers)["x-error"].decode()) for records in batches.values() for r in records
            ]
        return found
    finally:
        await consumer.stop()


async def test_a_batch_of_usage_over_more_than_100_months_is_written_whole_and_the_sink_moves_on(settings):
    await ensure_topics(settings, (USAGE,))
    account = uuid.uuid4()
    backfill = [stamped(usage(account, months_back(k))) for k in range(MONTHS)]
    after = (usage(account, datetime.now(UTC)), None)  # live traffic behind the backfill
    await produce(settings, USAGE, [*backfill, *backfill[:7], after])

    async with sink_running(settings) as count:
        rows = f"SELECT count() FROM {{db}}.usage_events WHERE account_id = '{account}'"
        months = f"SELECT uniqExact(toYYYYMM(time)) FROM {{db}}.usage_events WHERE account_id = '{account}'"
        await wait_until(lambda: _equals(count(rows), MONTHS + 1), timeout=40)
        assert await count(months) == MONTHS  # the live event shares the current month
        await wait_until(lambda: committed_to_the_end(settings, USAGE, "metering.usage"), timeout=20)
        assert await count(rows) == MONTHS + 1  # each id once, the repeated seven too


async def test_calls_over_101_months_are_dead_lettered_or_written_by_the_time_rule_and_the_sink_moves_on(settings):
    await ensure_topics(settings, (CALLS,))
    account = uuid.uuid4()
    # A producer whose events carry times over 101 months but are recorded now: those more than
    # 35 days before their record go to the dead-letter topic (here all but the two latest).
    skewed = [(call(account, NOW - timedelta(days=31 * k)), None) for k in range(101)]
    backfill = [stamped(call(account, months_back(k))) for k in range(MONTHS)]  # history, stamped as such
    after = (call(account, datetime.now(UTC)), None)
    await produce(settings, CALLS, [*skewed, *backfill, after])

    async with sink_running(settings) as count:
        rows = f"SELECT count() FROM {{db}}.call_events WHERE account_id = '{account}'"
        await wait_until(lambda: _equals(count(rows), 2 + MONTHS + 1), timeout=40)
        await wait_until(lambda: committed_to_the_end(settings, CALLS, "metering.calls"), timeout=20)
        refused = await dead_letters(settings, CALLS)
    assert sorted(i for i, _ in refused) == sorted(str(e.id) for e, _ in skewed[2:])
    assert all(reason.startswith("time: more than 35 days before") for _, reason in refused)


async def _equals(value: Awaitable[int], expected: int) -> bool:
    return await value == expected
