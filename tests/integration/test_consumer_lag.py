"""Consumer lag read from the cluster (services/runtime/platform/consumer_lag.py), on real Kafka:
each partition's log end minus the group's commit, for this Tollgate's groups only, and on the
running platform's /metrics for the groups that consume calls.v1; with Kafka away a pass fails
and leaves no client open."""

import gc
import uuid

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from contracts.topics import CALLS
from services.runtime.platform.consumer_lag import ConsumerLag
from services.runtime.platform.group_handover import GroupHandover, commit_offsets
from services.runtime.platform.kafka import ensure_topics
from services.runtime.platform.settings import Settings
from tests.support.apps import running_app
from tests.support.backfill import call, produce
from tests.support.metering import wait_until

pytestmark = pytest.mark.integration


async def commit(settings: Settings, group: str, offsets: dict[TopicPartition, int]) -> None:
    await commit_offsets(settings.kafka_bootstrap_servers, group, offsets)


async def calls_partition_with(settings: Settings, records: int) -> tuple[TopicPartition, int]:
    """calls.v1's partition 0 with `records` more records, and its log end offset."""
    await ensure_topics(settings, (CALLS,))
    tp = TopicPartition(settings.topic(CALLS.name), 0)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers)
    await producer.start()
    try:
        for n in range(records):
            end = (await producer.send_and_wait(tp.topic, b"{}", partition=0, key=str(n).encode())).offset + 1
    finally:
        await producer.stop()
    return tp, end


async def test_lag_is_the_log_end_minus_the_groups_commit_for_this_tollgates_groups_only(settings):
    tp, _end = await calls_partition_with(settings, 10)
    ours, another_tollgates = settings.group("lag-test"), f"x{uuid.uuid4().hex[:8]}.tollgate.lag-test"
    await commit(settings, ours, {tp: 4})
    await commit(settings, another_tollgates, {tp: 1})

    reader = ConsumerLag(settings)
    assert await reader.read() == {(ours, tp): 6}  # the other prefix's group is not this Tollgate's
    await reader.export()
    labels = {"group": ours, "topic": tp.topic, "partition": "0"}
    assert REGISTRY.get_sample_value("tollgate_kafka_consumer_lag", labels) == 6
    assert REGISTRY.get_sample_value("tollgate_kafka_consumer_committed_offset", labels) == 4  # TollgateConsumerStalled

    await commit(settings, ours, {tp: 10})
    assert await reader.read() == {(ours, tp): 0}
    await reader.export()
    assert REGISTRY.get_sample_value("tollgate_kafka_consumer_committed_offset", labels) == 10


async def test_a_group_handed_over_shows_no_lag_of_its_own_any_more(settings):
    tp, end = await calls_partition_with(settings, 1)
    old, new = settings.group(f"lag-old-{uuid.uuid4().hex[:6]}"), settings.group(f"lag-new-{uuid.uuid4().hex[:6]}")
    await commit(settings, old, {tp: end - 1})
    reader = ConsumerLag(settings)
    await reader.export()
    old_labels = {"group": old, "topic": tp.topic, "partition": "0"}
    assert REGISTRY.get_sample_value("tollgate_kafka_consumer_lag", old_labels) == 1

    assert not await GroupHandover(settings.kafka_bootstrap_servers, tp.topic, old, new).hand_over()
    await reader.export()
    # the old group's last lag would otherwise stay on /metrics until the process restarts
    assert REGISTRY.get_sample_value("tollgate_kafka_consumer_lag", old_labels) == 0
    assert REGISTRY.get_sample_value("tollgate_kafka_consumer_lag", {**old_labels, "group": new}) == 1


async def test_the_platform_exports_the_lag_of_every_group_that_consumes_call_events(settings):
    settings = settings.model_copy(update={"consumer_lag_interval_seconds": 0.2})
    async with running_app(settings) as (_app, client):
        account = uuid.uuid4()
        events = [call(account, n) for n in range(20)]
        topic = settings.topic(CALLS.name)
        await produce(settings, [(topic, str(account).encode(), e.model_dump_json().encode(), None) for e in events])

        async def caught_up() -> set[str] | None:
            """The groups with a lag series on calls.v1, once every one of them is at 0."""
            body = (await client.get("/metrics")).text
            lags = {
                (sample.labels["group"], sample.labels["partition"]): sample.value
                for family in text_string_to_metric_families(body)
                if family.name == "tollgate_kafka_consumer_lag"
                for sample in family.samples
                if sample.labels["topic"] == topic and sample.labels["group"].startswith(settings.group(""))
            }
            groups = {group for group, _ in lags}
            return groups if len(groups) == 3 and not any(lags.values()) else None

        groups = await wait_until(caught_up, timeout=60)
    assert groups == {settings.group(name) for name in ("quota.calls", "metering.calls", "keys.last-used")}


async def test_a_pass_with_kafka_away_fails_and_leaves_no_client_open(caplog):
    reader = ConsumerLag(Settings(kafka_bootstrap_servers="127.0.0.1:1", database_url="postgresql://u@h/d"))
    with pytest.raises(KafkaError):
        await reader.read()
    gc.collect()  # an unclosed aiokafka client says so when it is collected
    assert not [r for r in caplog.records if "Unclosed" in r.getMessage()]
