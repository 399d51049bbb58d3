"""usage.v1 as the ingest endpoint writes it: each event keyed by its account (one partition per
account keeps its order), the batch acknowledged within the publish timeout or a 503."""

import asyncio

from contracts.events import UsageEvent
from contracts.topics import USAGE
from services.edge import Runtime
from services.runtime.platform.kafka import within_publish_timeout


class UsageTopic:
    def __init__(self, runtime: Runtime) -> None:
        self.broker = runtime.broker
        self.topic = runtime.settings.topic(USAGE.name)

    async def publish(self, events: list[UsageEvent]) -> None:
        # Unacknowledged within the timeout -> 503; the caller retries with the same ids (idempotent).
        await within_publish_timeout(asyncio.gather(*(self._one(e) for e in events)))

    async def _one(self, event: UsageEvent) -> None:
        await self.broker.publish(event, self.topic, key=str(event.account_id).encode())
