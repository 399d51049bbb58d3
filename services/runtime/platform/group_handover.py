"""A topic handed from one consumer group to another, where it left off.

A group that starts for the first time reads its topics from the earliest offset. When a topic
moves to a group of its own (quota's calls.v1, issue 38), that would make an existing deployment
count the topic's whole retention again: harmless (counting is idempotent on the event id), but
hours of work. And the old group would keep its offsets on a topic it no longer reads, a lag that
grows forever on the dashboards and pages the operator (TollgateConsumerLagGrowing, TollgateConsumerStalled).

So before its subscribers start, the process gives the new group the old one's committed offsets
(only if the new group has none: it is never moved back) and then deletes the old group's offsets
on that topic. Kafka refuses the delete while a member of the old group still reads the topic (a
replica of the previous version, in a rolling upgrade): it is asked again every `retry_s` until
it is done. While both groups read, each event is counted by whichever comes first; the other
finds it processed.
"""

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Int16, Int32, Schema, String

log = logging.getLogger(__name__)

GROUP_SUBSCRIBED_TO_TOPIC = 86  # the old group still has a member reading the topic
GROUP_ID_NOT_FOUND = 69
UNKNOWN_TOPIC_OR_PARTITION = 3
DONE_CODES = {0, GROUP_ID_NOT_FOUND, UNKNOWN_TOPIC_OR_PARTITION}


@dataclass(frozen=True)
class Handover:
    """What to do: `start` is committed for the new group, then the old group's offsets on the
    topic are deleted (if it has any)."""

    start: dict[TopicPartition, int]
    delete_old: bool


def plan(new: dict[TopicPartition, int], old: dict[TopicPartition, int]) -> Handover:
    """`new`/`old`: each group's committed offsets on the topic's partitions (absent: none)."""
    return Handover(start={} if new else dict(old), delete_old=bool(old))


async def commit_offsets(bootstrap_servers: str, group: str, offsets: dict[TopicPartition, int]) -> None:
    """Commits `offsets` for `group` without joining it (a consumer with the partitions assigned by hand)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_servers, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(list(offsets))
        await consumer.commit(offsets)
    finally:
        await consumer.stop()


# Kafka's OffsetDelete (KIP-496, API key 47), which aiokafka's admin client does not offer.
class _OffsetDeleteResponseV0(Response):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = 47
    API_VERSION = 0
    SCHEMA = Schema(
        ("error_code", Int16),
        ("throttle_time_ms", Int32),
        ("topics", Array(("name", String("utf-8")), ("partitions", Array(("partition_index", Int32), ("error_code", Int16))))),
    )


class _OffsetDeleteRequestV0(RequestStruct):  # type: ignore[misc]
    API_KEY = 47
    API_VERSION = 0
    RESPONSE_TYPE = _OffsetDeleteResponseV0
    SCHEMA = Schema(
        ("group_id", String("utf-8")),
        ("topics", Array(("name", String("utf-8")), ("partitions", Array(Int32)))),
    )


class _OffsetDelete(Request[_OffsetDeleteRequestV0]):  # type: ignore[misc]
    API_KEY = 47

    def __init__(self, group: str, topic: str, partitions: Sequence[int]) -> None:
        self._group = group
        self._topic = topic
        self._partitions = list(partitions)

    def build(self, request_struct_class: type[_OffsetDeleteRequestV0]) -> _OffsetDeleteRequestV0:
        return request_struct_class(self._group, [(self._topic, self._partitions)])


class GroupHandover:
    """A consumer loop (Component.consumers): runs before the subscribers start, where they run."""

    def __init__(self, bootstrap_servers: str, topic: str, old_group: str, new_group: str, retry_s: float = 30.0) -> None:
        self._bootstrap = bootstrap_servers
        self._topic = topic
        self._old = old_group
        self._new = new_group
        self._retry_s = retry_s
        self._retrying: asyncio.Task[None] | None = None

    async def start(self) -> None:
        try:
            pending = await self.hand_over()
        except Exception:
            # The new group then starts from the earliest offset: slow, not wrong (idempotent counting).
            log.warning("could not hand %s from %s to %s", self._topic, self._old, self._new, exc_info=True)
            return
        if pending:
            self._retrying = asyncio.create_task(self._delete_old(), name=f"handover:{self._topic}")

    async def close(self) -> None:
        if self._retrying is not None:
            self._retrying.cancel()
            await asyncio.gather(self._retrying, return_exceptions=True)

    async def hand_over(self) -> bool:
        """Gives the new group the old one's place; True while the old group's offsets remain."""
        admin = AIOKafkaAdminClient(bootstrap_servers=self._bootstrap)
        await admin.start()
        try:
            partitions = await self._partitions(admin)
            if not partitions:
                return False
            new = await self._committed(admin, self._new, partitions)
            old = await self._committed(admin, self._old, partitions)
            handover = plan(new, old)
            if handover.start:
                await commit_offsets(self._bootstrap, self._new, handover.start)
                log.info("handed %s from group %s to %s at %s", self._topic, self._old, self._new, handover.start)
            return handover.delete_old and not await self._delete(admin, partitions)
        finally:
            await admin.close()

    async def _delete_old(self) -> None:
        while True:
            await asyncio.sleep(self._retry_s)
            admin = AIOKafkaAdminClient(bootstrap_servers=self._bootstrap)
            try:
                await admin.start()
                if await self._delete(admin, await self._partitions(admin)):
                    return
            except Exception:
                log.warning("deleting %s's offsets on %s failed; trying again", self._old, self._topic, exc_info=True)
            finally:
                await admin.close()

    async def _partitions(self, admin: AIOKafkaAdminClient) -> list[TopicPartition]:
        described = await admin.describe_topics([self._topic])
        return [TopicPartition(self._topic, p["partition"]) for t in described if t["error_code"] == 0 for p in t["partitions"]]

    @staticmethod
    async def _committed(admin: AIOKafkaAdminClient, group: str, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        offsets = await admin.list_consumer_group_offsets(group, partitions=partitions)
        return {tp: meta.offset for tp, meta in offsets.items() if meta.offset >= 0}

    async def _delete(self, admin: AIOKafkaAdminClient, partitions: list[TopicPartition]) -> bool:
        """Deletes the old group's offsets on the topic; False while a member still reads it."""
        coordinator = await admin.find_coordinator(self._old)
        request = _OffsetDelete(self._old, self._topic, [tp.partition for tp in partitions])
        answer = await admin._send_request(request, coordinator)
        codes = {answer.error_code} | {code for _, parts in answer.topics for _, code in parts}
        if codes <= DONE_CODES:
            log.info("deleted group %s's offsets on %s", self._old, self._topic)
            return True
        if codes - DONE_CODES != {GROUP_SUBSCRIBED_TO_TOPIC}:
            raise RuntimeError(f"OffsetDelete of {self._old} on {self._topic} answered error codes {sorted(codes)}")
        log.info("group %s still has a member reading %s; its offsets are deleted once it stops", self._old, self._topic)
        return False
