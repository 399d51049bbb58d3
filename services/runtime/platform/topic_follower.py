"""Reads whole topics into memory and follows them: every process gets every partition.

No consumer group (each process needs all of it), from the beginning; `caught_up` is set once
the positions reach the end offsets seen at start, which is when the edge may call itself ready.
One consumer follows all of a process's projection topics: each more consumer is another fetch
loop and another connection to wake up for, idle or not.

The end offsets are asked of a second consumer whose partitions are all paused, so it never has a
fetch in flight: the broker answers a connection's requests in order, and the follower's own
connection always has one, held until a record comes or the fetch wait is up (0.5 s, 3 s when
idle). An end offsets lookup behind it waited that long: half a second of every process's start,
twice (the edge's follower and metering's), and as much again before the edge was ready. (Assigned,
not merely started: assigning asks for every topic's metadata at once; a lookup of topics the
consumer does not know learns them one refresh at a time.)
"""

import asyncio
import logging
from collections.abc import Callable, Mapping

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from services.runtime.platform.kafka import FETCH_WAIT_MS, IDLE_WAKE_MS, adapt_started
from services.runtime.platform.moved_leaders import follow_moved_leaders

log = logging.getLogger(__name__)

Apply = Callable[[bytes | None, bytes | None], None]


# How long `getmany` waits for records before the loop looks again: short while catching up (the
# position may pass the start's end offsets without a record, e.g. compacted away), then long.
# Records end the wait at once either way.
CATCHING_UP_MS, CAUGHT_UP_MS = 200, 2000


class TopicFollower:
    """Follows `topics` (name -> what to do with each record, key and value) with one consumer."""

    def __init__(self, bootstrap_servers: str, topics: Mapping[str, Apply]) -> None:
        self._bootstrap = bootstrap_servers
        self._topics = dict(topics)
        self.caught_up = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._lookups: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=FETCH_WAIT_MS,
            consumer_timeout_ms=IDLE_WAKE_MS,
        )
        await consumer.start()
        adapt_started(consumer)
        partitions = await self._partitions()
        self._lookups = lookups = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap, enable_auto_commit=False, consumer_timeout_ms=IDLE_WAKE_MS
        )
        await lookups.start()
        follow_moved_leaders(lookups)
        lookups.assign(partitions)
        lookups.pause(*partitions)  # before its fetcher runs: it never fetches
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        self._consumer = consumer
        targets = await lookups.end_offsets(partitions)
        self._task = asyncio.create_task(self._run(consumer, targets), name=f"follow:{','.join(self._topics)}")

    async def _partitions(self) -> list[TopicPartition]:
        admin = AIOKafkaAdminClient(bootstrap_servers=self._bootstrap)
        await admin.start()
        try:
            for _ in range(100):
                described = await admin.describe_topics(list(self._topics))
                if all(d["error_code"] == 0 and d["partitions"] for d in described):
                    return sorted(TopicPartition(d["topic"], p["partition"]) for d in described for p in d["partitions"])
                await asyncio.sleep(0.1)  # just created: the metadata is on its way
        finally:
            await admin.close()
        raise RuntimeError(f"topics {sorted(self._topics)} do not all exist")

    async def _run(self, consumer: AIOKafkaConsumer, targets: dict[TopicPartition, int]) -> None:
        pending = {tp: end for tp, end in targets.items() if end > 0}
        if not pending:
            self.caught_up.set()
        while True:
            try:
                wait_ms = CAUGHT_UP_MS if self.caught_up.is_set() else CATCHING_UP_MS
                batches = await consumer.getmany(timeout_ms=wait_ms, max_records=5000)
            except asyncio.CancelledError:
                raise
            except Exception:  # the broker is away: keep serving what we have, retry
                log.warning("follower of %s lost the broker; retrying", sorted(self._topics), exc_info=True)
                await asyncio.sleep(1)
                continue
            for tp, records in batches.items():
                apply = self._topics[tp.topic]
                for record in records:
                    try:
                        apply(record.key, record.value)
                    except Exception:
                        log.exception("bad record in %s at offset %s skipped", tp.topic, record.offset)
                if tp in pending and records and records[-1].offset + 1 >= pending[tp]:
                    del pending[tp]
            if pending:
                for tp in list(pending):
                    if await consumer.position(tp) >= pending[tp]:
                        del pending[tp]
            if not pending and not self.caught_up.is_set():
                self.caught_up.set()

    async def reach_current_end(self, poll_s: float = 0.05) -> None:
        """Return once every partition has been read to its end offset as of this call (what an
        owner just republished, say): the follower's own loop does the reading."""
        consumer, lookups = self._consumer, self._lookups
        if consumer is None or lookups is None:
            return
        targets = await lookups.end_offsets(sorted(consumer.assignment()))
        while True:
            behind = [tp for tp, end in targets.items() if await consumer.position(tp) < end]
            if not behind:
                return
            await asyncio.sleep(poll_s)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._consumer:
            await self._consumer.stop()
        if self._lookups:
            await self._lookups.stop()
