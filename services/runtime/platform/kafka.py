"""Kafka plumbing: topic provisioning and the FastStream broker every process shares."""

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaTimeoutError, TopicAlreadyExistsError
from faststream.kafka import KafkaBroker

from contracts.topics import ALL_DEAD_LETTER_TOPICS, ALL_TOPICS, Topic
from services.runtime.platform.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

# How long a request may wait for Kafka's ack before it answers 503 (the producer alone would
# keep retrying while the broker is away, and the caller would hang).
PUBLISH_TIMEOUT_S = 5.0


async def within_publish_timeout(pending: Awaitable[T], seconds: float = PUBLISH_TIMEOUT_S) -> T:
    """Await a publish or an outbox flush; KafkaTimeoutError (-> 503) if Kafka does not ack in time."""
    try:
        return await asyncio.wait_for(pending, seconds)
    except TimeoutError as exc:
        raise KafkaTimeoutError(f"no acknowledgement from Kafka within {seconds:.0f}s") from exc


# Producers use acks=all but NOT Kafka's idempotent mode: aiokafka's idempotent sender dies for
# good on OutOfOrderSequenceNumber once a broker outage expires a batch (the fault suite hit it).
# A retry may then write a message twice, which changes nothing: every consumer is idempotent
# on the event id. Order per partition still holds: aiokafka has one request in flight per broker.
PRODUCER_CONFIG: dict[str, Any] = {"enable_idempotence": False, "acks": "all"}


def make_broker(settings: Settings) -> KafkaBroker:
    """The process's broker: a publish that returns is durable (acks=all)."""
    return KafkaBroker(
        # FastStream takes a string as ONE host; aiokafka itself splits "a:1,b:2" (a cluster's list).
        [server.strip() for server in settings.kafka_bootstrap_servers.split(",")],
        **PRODUCER_CONFIG,
        linger_ms=5,
        # A publish the response waits on gives up after this, and the caller gets a 503.
        request_timeout_ms=5000,
        client_id="tollgate",
        logger=log,
        # FastStream logs every message it handles; at INFO that is a line per event on hot paths.
        log_level=logging.DEBUG,
    )


async def ensure_topics(settings: Settings, topics: tuple[Topic, ...] = ALL_TOPICS + ALL_DEAD_LETTER_TOPICS) -> None:
    """Create the topics (with their partitions and configs) that do not exist yet, and bring the
    configs of those that do up to what this version sets."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
    await admin.start()
    replication = settings.kafka_replication_factor
    # Replicated, an acks=all write waits for a majority of the replicas (2 of 3): it survives the
    # loss of any one broker, and the partition still takes writes while one broker is away.
    durability = {"min.insync.replicas": str(replication // 2 + 1)} if replication > 1 else {}
    try:
        existing = set(await admin.list_topics())
        wanted = [
            NewTopic(
                name=settings.topic(t.name),
                num_partitions=t.partitions,
                replication_factor=replication,
                topic_configs={**durability, **dict(t.config)},
            )
            for t in topics
            if settings.topic(t.name) not in existing
        ]
        if wanted:
            try:
                await admin.create_topics(wanted)
            except TopicAlreadyExistsError:
                pass  # a replica starting at the same moment created it first
        present = {settings.topic(t.name): {**durability, **dict(t.config)} for t in topics if settings.topic(t.name) in existing}
        if present:
            await _update_configs(admin, present)
    finally:
        await admin.close()


DYNAMIC_TOPIC_CONFIG = 1  # a config's source: set on the topic itself (not a broker default)


async def _update_configs(admin: AIOKafkaAdminClient, wanted: dict[str, dict[str, str]]) -> None:
    """A topic created by an older version keeps the configs it was created with (e.g. usage.v1
    kept by time, which can delete records before they are read): set the ones this version sets,
    keeping any other per-topic setting an operator made. Kafka's AlterConfigs replaces a topic's
    whole set, hence the read first."""
    responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name) for name in wanted])
    changed = []
    for response in responses:
        for error_code, _, _, name, entries in response.resources:
            if error_code != 0 or name not in wanted:
                continue
            current = {entry[0]: entry[1] for entry in entries if entry[3] == DYNAMIC_TOPIC_CONFIG}
            if any(current.get(key) != value for key, value in wanted[name].items()):
                changed.append(ConfigResource(ConfigResourceType.TOPIC, name, configs={**current, **wanted[name]}))
    if changed:
        await admin.alter_configs(changed)
        log.warning("topic configs brought up to date: %s", ", ".join(r.name for r in changed))
