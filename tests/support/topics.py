"""What a topic holds, read back by a test."""

from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord


async def topic_records(bootstrap_servers: str, topic: str) -> list[ConsumerRecord[Any, Any]]:
    """Every record of `topic` from the earliest offset, until a fetch brings nothing for 1.5 s."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap_servers, auto_offset_reset="earliest")
    await consumer.start()
    try:
        found: list[ConsumerRecord[Any, Any]] = []
        while batches := await consumer.getmany(timeout_ms=1500):
            for records in batches.values():
                found += records
        return found
    finally:
        await consumer.stop()
