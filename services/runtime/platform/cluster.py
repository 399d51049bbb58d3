"""What a process asks the Kafka cluster now and then (does it answer, which of Tollgate's topics
exist, their offsets, its groups' committed offsets), on clients kept between the questions.

A new aiokafka client starts by fetching the metadata of every topic in the cluster, and so do
the admin client's `list_topics` and `describe_cluster` (FastStream's `ping`). On a cluster
shared with other applications that answer grows with their topics, and the readiness probe (every
5 s), each owner's state guard and the consumer-lag reader made one or two of them per pass: an
idle process spent a quarter of its CPU decoding other applications' topics (BENCHMARKS.md,
"idle"). Kept clients name Tollgate's own topics in every question. A client that failed is
closed, and the question asked again at once on a new one: a restarted or wiped broker leaves
nothing stale.
"""

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaConnectionError
from aiokafka.protocol.metadata import MetadataRequest

T = TypeVar("T")
UNKNOWN_TOPIC = 3  # UNKNOWN_TOPIC_OR_PARTITION in a metadata answer


class ClusterReader:
    def __init__(self, bootstrap_servers: str) -> None:
        self._bootstrap = bootstrap_servers
        self._metadata: AIOKafkaClient | None = None
        self._offsets: AIOKafkaConsumer | None = None
        self._admin: AIOKafkaAdminClient | None = None

    async def missing(self, topics: Sequence[str]) -> list[str]:
        """Which of `topics` the cluster does not have. Never creates one (a broker that creates
        topics on a metadata request would make them with its defaults, not Tollgate's configs)."""
        answer = await self._asked(lambda: self._metadata_topics(topics))
        return [t["topic"] for t in answer if t["error_code"] == UNKNOWN_TOPIC]

    async def answers(self, topic: str) -> bool:
        """The cluster answers a question about one of Tollgate's topics (the readiness probe)."""
        await self._asked(lambda: self._metadata_topics([topic]))
        return True

    async def offsets(self, partitions: Sequence[TopicPartition]) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
        """Each partition's beginning and end offsets."""

        async def ask() -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
            reader = await self._offsets_reader()
            return await reader.beginning_offsets(list(partitions)), await reader.end_offsets(list(partitions))

        return await self._asked(ask)

    async def end_offsets(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        async def ask() -> dict[TopicPartition, int]:
            ends: dict[TopicPartition, int] = await (await self._offsets_reader()).end_offsets(list(partitions))
            return ends

        return await self._asked(ask)

    async def committed(self, group_prefix: str) -> dict[str, dict[TopicPartition, int]]:
        """Every group named with `group_prefix`: its committed offset on each partition it has one on."""

        async def ask() -> dict[str, dict[TopicPartition, int]]:
            admin = await self._admin_client()
            groups = [group for group, *_ in await admin.list_consumer_groups() if group.startswith(group_prefix)]
            committed: dict[str, dict[TopicPartition, int]] = {}
            for group in groups:
                offsets = await admin.list_consumer_group_offsets(group)
                committed[group] = {tp: meta.offset for tp, meta in offsets.items() if meta.offset >= 0}
            return committed

        return await self._asked(ask)

    async def close(self) -> None:
        metadata, offsets, admin = self._metadata, self._offsets, self._admin
        self._metadata = self._offsets = self._admin = None
        if metadata is not None:
            await metadata.close()
        if offsets is not None:
            await offsets.stop()
        if admin is not None:
            await admin.close()

    async def _asked(self, ask: Callable[[], Awaitable[T]]) -> T:
        """`ask` on the kept clients; if that fails, once more at once on new ones (the broker may
        have restarted since the last question, as a new client each pass never noticed)."""
        kept = any(client is not None for client in (self._metadata, self._offsets, self._admin))
        try:
            return await ask()
        except Exception:
            await self.close()
            if not kept:
                raise
        except BaseException:  # cancelled mid-question: its clients may be half used
            await self.close()
            raise
        try:
            return await ask()
        except BaseException:
            await self.close()
            raise

    async def _metadata_topics(self, topics: Sequence[str]) -> list[dict[str, Any]]:
        if self._metadata is None:
            self._metadata = AIOKafkaClient(bootstrap_servers=self._bootstrap)  # kept first: a failed start is closed too
            await self._metadata.bootstrap()
        node = self._metadata.get_random_node()
        if node is None:
            raise KafkaConnectionError("no broker known")
        answer = await self._metadata.send(node, MetadataRequest(list(topics), allow_auto_topic_creation=False))
        topics_of: list[dict[str, Any]] = answer.to_object()["topics"]
        return topics_of

    async def _offsets_reader(self) -> AIOKafkaConsumer:
        if self._offsets is None:
            self._offsets = AIOKafkaConsumer(bootstrap_servers=self._bootstrap, enable_auto_commit=False)
            await self._offsets.start()
        return self._offsets

    async def _admin_client(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            self._admin = AIOKafkaAdminClient(bootstrap_servers=self._bootstrap)
            await self._admin.start()
        return self._admin
