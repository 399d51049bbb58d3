"""Consumer lag, read from outside the groups, as `kafka-consumer-groups.sh --describe` reads it.

For every consumer group of this Tollgate (`Settings.group`'s prefix), each partition it has
committed on: the partition's log end offset minus the group's committed offset, i.e. the records
the group has not yet handled and committed. Exported as `tollgate_kafka_consumer_lag{group,
topic, partition}` every `CONSUMER_LAG_INTERVAL_SECONDS`.

Not the consumers' own view (their fetch position against the high watermark their last fetch
brought back): a consumer that stopped fetching keeps showing what it saw last, so a stall would
look like no lag. Read from the cluster, a stalled or slow group's lag grows whatever its
consumers believe (docs/architecture.md, "Consumer lag").
"""

import logging
from collections.abc import Mapping

from aiokafka import TopicPartition
from prometheus_client import Gauge

from services.runtime.platform.cluster import ClusterReader
from services.runtime.platform.periodic import Periodic
from services.runtime.platform.settings import Settings

log = logging.getLogger(__name__)

LAG = Gauge(
    "tollgate_kafka_consumer_lag",
    "Records a consumer group has not committed yet: log end offset - committed offset, per partition (unit: records)",
    ["group", "topic", "partition"],
    multiprocess_mode="mostrecent",  # one process reads it for the whole cluster (serve's consumers' process)
)
# With the lag, what tells a stuck group from a busy one: a lag above 0 whose commit has not
# moved for minutes (TollgateConsumerStalled), whatever the size of the lag or the topic's pace.
COMMITTED = Gauge(
    "tollgate_kafka_consumer_committed_offset",
    "The offset a consumer group has committed, per partition (unit: offset)",
    ["group", "topic", "partition"],
    multiprocess_mode="mostrecent",
)


def lag(ends: Mapping[TopicPartition, int], committed: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Records past the commit, per partition committed on (never below 0: a log end read before
    a commit that was made meanwhile)."""
    return {tp: max(0, ends[tp] - offset) for tp, offset in committed.items() if tp in ends}


class ConsumerLag:
    """Reads every group's lag from the cluster and sets `LAG`, every `consumer_lag_interval_seconds`."""

    def __init__(self, settings: Settings) -> None:
        self._cluster = ClusterReader(settings.kafka_bootstrap_servers)
        self._prefix = settings.group("")
        interval = settings.consumer_lag_interval_seconds
        self._periodic = Periodic("consumer-lag", interval, self.export, what="reading consumer lag", log=log)
        self._exported: set[tuple[str, str, str]] = set()

    async def start(self) -> None:
        await self._periodic.start()

    async def close(self) -> None:
        await self._periodic.stop()
        await self._cluster.close()

    async def read(self) -> dict[tuple[str, TopicPartition], int]:
        """(group, partition) -> records not committed yet, for this Tollgate's groups."""
        committed, ends = await self._offsets()
        return {(group, tp): records for group, offsets in committed.items() for tp, records in lag(ends, offsets).items()}

    async def export(self) -> None:
        committed, ends = await self._offsets()
        exported: set[tuple[str, str, str]] = set()
        for group, offsets in committed.items():
            for tp, records in lag(ends, offsets).items():
                labels = (group, tp.topic, str(tp.partition))
                LAG.labels(*labels).set(records)
                COMMITTED.labels(*labels).set(offsets[tp])
                exported.add(labels)
        # A group whose offsets are gone (a handover deleted them) waits for nothing: its series
        # reads 0 instead of its last lag. Removing it is not possible in multiprocess mode.
        for labels in self._exported - exported:
            LAG.labels(*labels).set(0)
        self._exported = exported

    async def _offsets(self) -> tuple[dict[str, dict[TopicPartition, int]], dict[TopicPartition, int]]:
        """Every group's committed offsets, and the log end offsets of the partitions they name."""
        committed = await self._cluster.committed(self._prefix)
        partitions = sorted({tp for offsets in committed.values() for tp in offsets})
        ends = await self._cluster.end_offsets(partitions) if partitions else {}
        return committed, ends
