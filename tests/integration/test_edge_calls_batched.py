"""calls.v1 from the batched producer on real Kafka: every call arrives once, keyed and
partitioned by account exactly as per-message sends were, in order within each account."""

import time
import uuid
from datetime import UTC, datetime

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.partitioner import DefaultPartitioner
from prometheus_client import REGISTRY

from contracts.events import CallEvent
from contracts.topics import CALLS
from services.edge.calls import Call, CallRecorder
from services.runtime.platform.kafka import ensure_topics

pytestmark = pytest.mark.integration


def sent() -> float:
    return REGISTRY.get_sample_value("tollgate_edge_call_events_sent_total") or 0.0


async def test_batched_calls_arrive_once_partitioned_by_account_and_in_order(settings):
    await ensure_topics(settings, (CALLS,))
    accounts = [uuid.uuid4() for _ in range(7)]
    key = uuid.uuid4()
    recorder = CallRecorder(settings)  # recorded before it runs: its first pass fills several record batches per partition
    await recorder.start()
    before = sent()
    total = 1400
    try:
        for n in range(total):  # n rides in latency_ms so the order can be checked
            call = Call(datetime.now(UTC), accounts[n % 7], key, "GET", "/api/geo/projects", 200, "192.0.2.1", "t", float(n))
            assert recorder.reserve()  # as the edge does before it admits a call
            recorder.record(call)
    finally:
        await recorder.stop()  # drains what is buffered first
    assert sent() - before == total

    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap_servers, auto_offset_reset="earliest")
    await consumer.start()
    try:
        topic = settings.topic(CALLS.name)
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
        await admin.start()
        try:
            (described,) = await admin.describe_topics([topic])
        finally:
            await admin.close()
        partitions = sorted(p["partition"] for p in described["partitions"])
        assert len(partitions) > 1
        consumer.assign([TopicPartition(topic, p) for p in partitions])
        seen: list[tuple[int, bytes, CallEvent]] = []
        deadline = time.monotonic() + 20
        while len(seen) < total and time.monotonic() < deadline:
            for tp, records in (await consumer.getmany(timeout_ms=200)).items():
                seen += [(tp.partition, r.key, CallEvent.model_validate_json(r.value)) for r in records]
    finally:
        await consumer.stop()
    assert len(seen) == total and len({e.id for _, _, e in seen}) == total
    for partition, record_key, event in seen:
        assert record_key == str(event.account_id).encode()
        assert partition == DefaultPartitioner()(record_key, partitions, partitions)
    for account in accounts:
        order = [e.latency_ms for _, _, e in seen if e.account_id == account]
        assert order == sorted(order) and len(order) == total // 7
