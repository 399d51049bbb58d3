"""The kept Kafka clients of services/runtime/platform/cluster.py on a real broker: a metadata
question names Tollgate's topics only and never creates one; the clients are kept between
questions, and a question that fails on them is asked again at once on new ones; with Kafka
away a question fails and leaves no client open."""

import gc

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError, KafkaError

from contracts.topics import CALLS
from services.runtime.platform.cluster import ClusterReader
from services.runtime.platform.kafka import ensure_topics

pytestmark = pytest.mark.integration


async def test_missing_names_the_absent_topics_and_creates_none(settings):
    await ensure_topics(settings, (CALLS,))
    present, absent = settings.topic(CALLS.name), settings.topic("never-made.v1")
    cluster = ClusterReader(settings.kafka_bootstrap_servers)
    try:
        assert await cluster.missing([present, absent]) == [absent]
        assert await cluster.missing([absent]) == [absent]  # still absent: asking did not create it
        assert await cluster.answers(present)
    finally:
        await cluster.close()


async def test_clients_are_kept_between_questions_and_made_again_after_a_failure(settings):
    await ensure_topics(settings, (CALLS,))
    cluster = ClusterReader(settings.kafka_bootstrap_servers)
    partitions = [TopicPartition(settings.topic(CALLS.name), p) for p in range(CALLS.partitions)]
    try:
        await cluster.answers(settings.topic(CALLS.name))
        starts, ends = await cluster.offsets(partitions)
        assert set(starts) == set(ends) == set(partitions)
        kept = cluster._metadata, cluster._offsets
        await cluster.answers(settings.topic(CALLS.name))
        await cluster.end_offsets(partitions)
        assert (cluster._metadata, cluster._offsets) == kept  # no new client, no full metadata fetch

        asked: list[tuple[object, object]] = []

        async def fails_on_kept_clients() -> bool:
            asked.append((cluster._metadata, cluster._offsets))
            if len(asked) == 1:
                raise KafkaConnectionError("a broker restarted since the last question")
            return await cluster.answers(settings.topic(CALLS.name))

        assert await cluster._asked(fails_on_kept_clients)  # asked again at once, on new clients
        assert asked == [kept, (None, None)] and cluster._metadata not in (None, kept[0])
        with pytest.raises(ValueError):  # a question that fails on new clients too raises
            await cluster._asked(_failing)
        assert cluster._metadata is None and cluster._offsets is None
    finally:
        await cluster.close()


async def _failing() -> bool:
    raise ValueError("a question that failed")


async def test_with_kafka_away_a_question_fails_and_leaves_no_client_open(caplog):
    cluster = ClusterReader("127.0.0.1:1")
    with pytest.raises(KafkaError):
        await cluster.answers("t.keys.v1")
    with pytest.raises(KafkaError):
        await cluster.offsets([TopicPartition("t.keys.v1", 0)])
    gc.collect()  # an unclosed aiokafka client says so when it is collected
    assert not [r for r in caplog.records if "Unclosed" in r.getMessage()]
