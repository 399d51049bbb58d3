"""A record that nearly fills Kafka's message limit, and cannot be read, is dead-lettered like any
other: the copy keeps its head (the headers would not fit beside the whole of it) and says how
large it was, and the consumers go on. Before, its dead-letter publish failed at every
redelivery (MessageSizeTooLargeError) and held the metering sink and quota's counting at it for
good: no usage after it was ever written or counted."""

import json
import uuid
from datetime import UTC, datetime

import psycopg
import pytest
from aiokafka import AIOKafkaProducer

from contracts.topics import USAGE, dead_letter
from services.metering.store import MeteringStore
from services.runtime.platform.deadletter import MAX_DEAD_LETTER_KEY, MAX_DEAD_LETTER_VALUE
from tests.support.apps import running_app
from tests.support.metering import wait_until
from tests.support.topics import topic_records

pytestmark = pytest.mark.integration

NEARLY_ONE_MIB = 1_048_450  # Kafka's default limit is 1 MiB a message: it takes this, not it with the headers


async def _written(store: MeteringStore, account: str) -> int:
    sql = f"SELECT count() FROM {store.db}.usage_events WHERE account_id = toUUID('{account}')"
    return int(await store.reader.run(lambda c: c.query(sql).result_rows[0][0]))


async def _counted(database_url: str, account: str) -> int:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute("SELECT coalesce(sum(used), 0) FROM quota.counters WHERE account_id = %s", [account])
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def test_a_record_as_large_as_kafka_takes_is_dead_lettered_and_the_consumers_go_on(settings):
    account = str(uuid.uuid4())
    valid = {
        "id": str(uuid.uuid4()),
        "time": datetime.now(UTC).isoformat(),
        "account_id": account,
        "resource": "ai_tokens",
        "quantity": 7,
        "provider": "openai",
        "model": "gpt-4o",
        "source": "oversized-test",
    }
    long_key = account.encode() * 29_000  # a key near the limit with a value of its own
    async with running_app(settings, ("metering", "quota")):
        topic = settings.topic(USAGE.name)
        producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
        await producer.start()
        try:
            key = account.encode()  # one partition: the valid event is read after the others
            await producer.send_and_wait(topic, b"x" * NEARLY_ONE_MIB, key=key)
            await producer.send_and_wait(topic, b"{}", key=long_key)
            await producer.send_and_wait(topic, json.dumps(valid).encode(), key=key)
        finally:
            await producer.stop()

        store = MeteringStore(settings.clickhouse_dsn, settings.clickhouse_database)
        store.open()
        try:
            assert await wait_until(lambda: _written(store, account), timeout=30) == 1
        finally:
            store.close()
        assert await wait_until(lambda: _counted(settings.database_url, account), timeout=30) == 7

    letters = await topic_records(settings.kafka_bootstrap_servers, settings.topic(dead_letter(USAGE).name))
    big = [r for r in letters if dict(r.headers).get("x-truncated-from") == str(NEARLY_ONE_MIB).encode()]
    assert len(big) == 2  # once by each group: the sink's and quota's
    assert all(r.value == b"x" * MAX_DEAD_LETTER_VALUE and r.key == account.encode() for r in big)
    long_keyed = [r for r in letters if dict(r.headers).get("x-key-truncated-from") == str(len(long_key)).encode()]
    assert len(long_keyed) == 2
    assert all(r.value == b"{}" and r.key == long_key[:MAX_DEAD_LETTER_KEY] for r in long_keyed)
