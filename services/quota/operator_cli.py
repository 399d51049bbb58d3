"""The operator's `tollgate republish` for quota, run without any HTTP server: straight to
Postgres (the quota schema) and Kafka (quota publishes its states itself, without an outbox)."""

import asyncio
from collections.abc import Collection
from pathlib import Path

from contracts.topics import QUOTA
from services.quota.publisher import KafkaPublisher
from services.quota.service import QuotaService
from services.quota.store import QuotaStore
from services.runtime.platform.clock import system_clock
from services.runtime.platform.kafka import ensure_topics, make_broker
from services.runtime.platform.postgres import apply_migrations, open_pool
from services.runtime.platform.settings import Settings

MIGRATIONS = Path(__file__).parent / "migrations"


async def republish(settings: Settings, topics: Collection[str] = (QUOTA.name,)) -> dict[str, int]:
    await asyncio.to_thread(apply_migrations, settings.database_url, "quota", MIGRATIONS)  # idempotent
    await ensure_topics(settings)
    pool = open_pool(settings.database_url, max_size=2)
    await pool.open(wait=True, timeout=30)
    broker = make_broker(settings)
    try:
        await broker.connect()
        service = QuotaService(
            QuotaStore(pool), KafkaPublisher(broker, settings), system_clock, settings.tz, settings.console_url
        )
        return await service.republish(topics)
    finally:
        await broker.stop()
        await pool.close()
