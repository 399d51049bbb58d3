"""(v4) quota.v1 carries a second record type, a key's standing against one of its own limits
(KeyQuotaState). Alerts, the one quota.v1 reader outside quota and the edge, skips those records
quietly: nothing reaches quota.v1.dlq and the account states behind them are still stored. Real
Kafka and Postgres; both records on one partition, so the account state's arrival proves the key
state before it was handled."""

import uuid
from datetime import UTC, datetime

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from contracts.common import Resource
from contracts.events import KeyQuotaState, QuotaState
from contracts.key_limits import LimitPeriod, window_of
from contracts.topics import QUOTA, dead_letter
from services.runtime.platform.settings import Settings
from tests.integration.test_alerts_helpers import eventually, query, this_period
from tests.support.apps import running_app

pytestmark = pytest.mark.integration


async def _dead_letters(settings: Settings) -> list[bytes]:
    """Every record on quota.v1.dlq so far (read from the start to the end offsets)."""
    topic = dead_letter(QUOTA)
    name = settings.topic(topic.name)
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap_servers, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(name, p) for p in range(topic.partitions)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        values: list[bytes] = []
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                values.extend(r.value or b"" for r in records)
        return values
    finally:
        await consumer.stop()


async def test_alerts_skips_key_quota_states_without_dead_lettering_them(settings: Settings):
    account, key = uuid.uuid4(), uuid.uuid4()
    now = datetime.now(UTC)
    window, resets_at = window_of(LimitPeriod.DAY, now, UTC)
    key_state = KeyQuotaState(
        time=now,
        account_id=account,
        api_key_id=key,
        resource=Resource.AI_TOKENS,
        period=LimitPeriod.DAY,
        window=window,
        amount=50_000,
        used=49_000,
        blocked=False,
        resets_at=resets_at,
    )
    account_state = QuotaState(
        time=now, account_id=account, resource=Resource.AI_TOKENS, period=this_period(), total=100_000, used=42, blocked=False
    )
    async with running_app(settings, targets=("alerts",)):
        producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
        await producer.start()
        try:
            topic = settings.topic(QUOTA.name)
            await producer.send_and_wait(
                topic, key_state.model_dump_json().encode(), key=f"key:{key}:ai_tokens:day".encode(), partition=0
            )
            await producer.send_and_wait(
                topic, account_state.model_dump_json().encode(), key=f"{account}:ai_tokens".encode(), partition=0
            )
        finally:
            await producer.stop()

        def stored() -> bool:
            rows = query(settings, "SELECT used FROM alerts.quota_states WHERE account_id = %s", account)
            return [r["used"] for r in rows] == [42]

        await eventually(stored)  # after the key state on its partition: that one was handled
    assert not [v for v in await _dead_letters(settings) if str(key).encode() in v]
