"""A consumer's offset lookups follow a partition's leader when it moves.

A partition without a position (no committed offset yet, a `seek_to_beginning`) gets one from its
leader, as the consumer's metadata names it (ListOffsets). If that leader has moved (a broker was
restarted), the old one answers NOT_LEADER_FOR_PARTITION, and aiokafka (0.14) retries every 100 ms
without refreshing its metadata, although a fetch refreshes on the same error. The stale leader is
then asked until the periodic refresh (`metadata_max_age_ms`, 5 min), and in the meantime nothing
is fetched from that node for any partition: the fetcher holds a node's fetches while one of its
partitions awaits a reset. Seen in `make test-scale`: after a broker restart, a metering replica
killed; the survivor took over its partitions and fetched none of them for over 90 s.

The Java client refreshes on these errors (KAFKA-9535); `follow_moved_leaders` makes aiokafka's
fetcher do the same, by wrapping its offset request on the instance. tests/unit/test_moved_leaders.py
fails if an aiokafka upgrade moves it.
"""

from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError


def follow_moved_leaders(consumer: AIOKafkaConsumer) -> None:
    """After a started consumer's offset lookup meets a moved leader (an error that aiokafka marks
    `invalid_metadata`, as its own public offset lookups do), refresh its metadata: the fetcher asks
    again after its retry backoff, by then of the new leader."""
    fetcher = consumer._fetcher
    ask = fetcher._proc_offset_request

    async def asked(node_id: int, topic_data: Any) -> Any:
        try:
            return await ask(node_id, topic_data)
        except KafkaError as error:
            if error.invalid_metadata:
                fetcher._client.force_metadata_update()
            raise

    fetcher._proc_offset_request = asked
