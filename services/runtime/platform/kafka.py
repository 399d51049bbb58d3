"""Kafka plumbing: topic provisioning and the FastStream broker every process shares."""

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    InvalidProducerEpoch,
    KafkaTimeoutError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    TopicAlreadyExistsError,
    UnknownProducerId,
)
from faststream import BaseMiddleware
from faststream.kafka import KafkaBroker

from contracts.topics import ALL_DEAD_LETTER_TOPICS, ALL_TOPICS, Topic
from services.runtime.platform.fetch_pace import pace_when_idle
from services.runtime.platform.moved_leaders import follow_moved_leaders
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


# Every consumer's own pace (while it joins and while records flow; once idle, fetch_pace.py
# waits longer): how long the broker holds a fetch with nothing to return, and the fetcher task's
# timer with a fetch in flight. Neither is a latency floor in steady state (the broker answers a
# waiting fetch as soon as a record is appended); the fetch wait is one after a join, when records
# for a partition whose position was set after the fetch in flight was sent wait for that fetch to
# end: a 2 s wait cost each test starting consumers ~1.5 s (`make test` +3 min), hence Kafka's
# 500 ms until the consumer has settled (BENCHMARKS.md, "idle").
FETCH_WAIT_MS = 500  # fetch_max_wait_ms
IDLE_WAKE_MS = 2000  # consumer_timeout_ms: the fetcher task's timer with a fetch in flight (aiokafka's: 200)


# Producers are idempotent with acks=all: a retry inside the producer never writes a message
# twice, and order per partition holds. aiokafka (0.14.0, the newest) has no remedy of its own for
# a producer whose sequence numbers the broker refuses: a batch that expires while its partition
# has no leader (a broker SIGKILLed, > request_timeout_ms until a new leader) is given sequence
# numbers as it is failed (MessageAccumulator.drain_by_nodes -> _pop_batch), so every later batch
# to that partition fails with OutOfOrderSequenceNumber, for good (aio-libs/aiokafka#1017); a broker
# that forgot the producer answers alike. Java's client bumps its epoch then; here the producer is
# replaced (a new producer id starts from 0) and the caller sends again, as after any failure.
PRODUCER_CONFIG: dict[str, Any] = {"enable_idempotence": True, "acks": "all"}
STALE_PRODUCER_ERRORS = (OutOfOrderSequenceNumber, UnknownProducerId, InvalidProducerEpoch, ProducerFenced)
_retiring: set[asyncio.Task[None]] = set()  # referenced until done (the loop keeps weak ones)


def retire(producer: AIOKafkaProducer) -> None:
    """Stop a replaced producer in the background: what it still holds is sent or fails (the
    callers send that again through the new one); a broker that is away must not hold the caller."""
    task = asyncio.create_task(producer.stop(), name="retire-producer")
    _retiring.add(task)
    task.add_done_callback(_retiring.discard)


def _producer_config(settings: Settings) -> dict[str, Any]:
    return {
        # FastStream takes a string as ONE host; aiokafka itself splits "a:1,b:2" (a cluster's list).
        "bootstrap_servers": [server.strip() for server in settings.kafka_bootstrap_servers.split(",")],
        **PRODUCER_CONFIG,
        "linger_ms": 5,
        # A publish the response waits on gives up after this, and the caller gets a 503.
        "request_timeout_ms": 5000,
        "client_id": "tollgate",
    }


class _ProducerSwap:
    """Replaces a broker's producer, once for all the publishes that saw it go stale."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.lock = asyncio.Lock()
        self.holder: Any = None  # FastStream's producer holder, set once the broker exists

    def current(self) -> Any:
        return self.holder._producer  # FastStream keeps the aiokafka producer here; it has no swap of its own

    async def replace(self, stale: Any) -> None:
        async with self.lock:
            if self.current() is not stale:
                return  # another publish replaced it already
            log.warning("Kafka refused the broker's producer (sequence numbers); replacing it")
            fresh = AIOKafkaProducer(**self.config)
            try:
                await self.holder.connect(fresh, serializer=self.holder.serializer, codec=self.holder.codec)
            except Exception:  # Kafka away: the next refused publish tries again
                log.warning("could not start a new producer", exc_info=True)
                retire(fresh)
            else:
                retire(stale.producer)


class ReplaceStaleProducer(BaseMiddleware):
    """On the broker's publishes: one that failed because Kafka refused the producer replaces the
    producer and still fails (the caller sends again, as after any failed publish)."""

    def __init__(self, msg: Any, /, *, context: Any, swap: _ProducerSwap) -> None:
        super().__init__(msg, context=context)
        self.swap = swap

    async def publish_scope(self, call_next: Callable[[Any], Awaitable[Any]], cmd: Any) -> Any:
        used = self.swap.current()
        try:
            return await call_next(cmd)
        except STALE_PRODUCER_ERRORS:
            await self.swap.replace(used)
            raise


def make_broker(settings: Settings) -> KafkaBroker:
    """The process's broker: a publish that returns is durable (acks=all)."""
    config = _producer_config(settings)
    swap = _ProducerSwap(config)
    broker = KafkaBroker(
        **config,
        middlewares=[partial(ReplaceStaleProducer, swap=swap)],
        logger=log,
        # FastStream logs every message it handles; at INFO that is a line per event on hot paths.
        log_level=logging.DEBUG,
    )
    swap.holder = broker.config.producer
    return broker


def adapt_started(consumer: AIOKafkaConsumer) -> None:
    """What every started consumer of ours gets: a long fetch wait when idle, and offset lookups
    that follow a moved leader."""
    pace_when_idle(consumer)
    follow_moved_leaders(consumer)


async def start_subscribers(broker: KafkaBroker) -> None:
    """`broker.start()` with the subscribers started at once. aiokafka's start waits for the
    group's first assignment, and when another replica is in the group, that waits for the
    replica's next heartbeat (every 3 s) to rebalance: one subscriber after the other, a second
    `serve` worker took 30 s to start (BENCHMARKS.md, "http_load", round 2)."""
    await broker.connect()
    await asyncio.gather(*(subscriber.start() for subscriber in broker.subscribers))
    for subscriber in broker.subscribers:
        consumer = getattr(subscriber, "consumer", None)  # FastStream's aiokafka consumer, once started
        if consumer is not None:
            adapt_started(consumer)
    for publisher in broker.publishers:
        await publisher.start()
    broker.running = True


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
        # Applied by each broker from the metadata log: in force soon after this answer, not at once.
        for response in await admin.alter_configs(changed):
            for error_code, message, _, name in response.resources:
                if error_code != 0:
                    log.error("topic %s: Kafka refused its configs (error %d: %s)", name, error_code, message)
        log.warning("topic configs brought up to date: %s", ", ".join(r.name for r in changed))
