"""Where quota's states and crossings go: straight to Kafka, inside the use case's transaction
(published before the commit; see service.py for why a replay is harmless)."""

from faststream.kafka import KafkaBroker

from contracts.topics import Topic
from services.runtime.platform.settings import Settings


class KafkaPublisher:
    def __init__(self, broker: KafkaBroker, settings: Settings) -> None:
        self._broker = broker
        self._settings = settings

    async def publish(self, topic: Topic, key: str, payload: str) -> None:
        await self._broker.publish(payload.encode(), self._settings.topic(topic.name), key=key.encode())
