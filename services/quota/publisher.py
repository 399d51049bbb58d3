"""Where quota's states and crossings go: straight to Kafka, inside the use case's transaction
(published before the commit; see service.py for why a replay is harmless)."""

from faststream.kafka import KafkaBroker
from prometheus_client import Counter

from contracts.topics import QUOTA, QUOTA_THRESHOLDS, Topic
from services.runtime.platform.settings import Settings

STATES = Counter(
    "tollgate_quota_states_published_total",
    "Quota states published to quota.v1, by whether they block (blocked=true: a quota block) (unit: states)",
    ["blocked"],
)
CROSSINGS = Counter(
    "tollgate_quota_thresholds_published_total",
    "Threshold crossings published to quota-thresholds.v1 (unit: crossings)",
)
for _blocked in ("true", "false"):  # on /metrics at 0 from the start
    STATES.labels(_blocked)
BLOCKED = b'"blocked":true'  # as QuotaState.model_dump_json writes it (compact JSON)


class KafkaPublisher:
    def __init__(self, broker: KafkaBroker, settings: Settings) -> None:
        self._broker = broker
        self._settings = settings

    async def publish(self, topic: Topic, key: str, payload: str) -> None:
        value = payload.encode()
        await self._broker.publish(value, self._settings.topic(topic.name), key=key.encode())
        if topic == QUOTA:
            STATES.labels("true" if BLOCKED in value else "false").inc()
        elif topic == QUOTA_THRESHOLDS:
            CROSSINGS.inc()
