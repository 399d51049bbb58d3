"""The operator's `tollgate republish` for billing, run without any HTTP server: straight to
Postgres (the billing schema and its outbox) and Kafka."""

import asyncio
from collections.abc import Collection
from pathlib import Path
from uuid import UUID

from contracts.events import AccountState
from contracts.topics import BILLING
from services.billing.payments import TestProvider
from services.billing.service import BillingFact, BillingService
from services.billing.store import BillingStore
from services.runtime.platform.clock import system_clock
from services.runtime.platform.kafka import ensure_topics
from services.runtime.platform.outbox_relay import OutboxRelay
from services.runtime.platform.postgres import apply_migrations, open_pool
from services.runtime.platform.settings import Settings

MIGRATIONS = Path(__file__).parent / "migrations"


class _NoAccounts:
    """Republishing reads no user type (only payments and switches do)."""

    def get(self, account_id: UUID) -> AccountState | None:
        return None


class _Flush:
    """Delivering is publishing the outbox: there is no edge in this process."""

    def __init__(self, relay: OutboxRelay) -> None:
        self._relay = relay

    async def deliver(self, facts: list[BillingFact]) -> None:
        await self._relay.publish_committed()


async def republish(settings: Settings, topics: Collection[str] = (BILLING.name,)) -> dict[str, int]:
    await asyncio.to_thread(apply_migrations, settings.database_url, "billing", MIGRATIONS)  # idempotent
    await ensure_topics(settings)
    pool = open_pool(settings.database_url, max_size=2)
    await pool.open(wait=True, timeout=30)
    relay = OutboxRelay(pool, settings, "billing")
    try:
        await relay.open()
        service = BillingService(
            BillingStore(pool), relay, _NoAccounts(), TestProvider(), system_clock, settings.tz, edge=_Flush(relay)
        )
        return await service.republish(topics)
    finally:
        await relay.stop()
        await pool.close()
