"""The operator's `tollgate service-token ...` commands, run without any HTTP server: straight
to Postgres (the keys schema and its outbox) and Kafka. Each command commits its row and outbox
row in one transaction and flushes the outbox itself, so a revocation is in Kafka (and thus in
force on every replica within milliseconds) when the command returns."""

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

from psycopg_pool import AsyncConnectionPool

from contracts.audit import OPERATOR_CLI
from contracts.common import ServiceScope
from services.keys import service_tokens
from services.keys.store import KeysStore, KeysTx, Row
from services.runtime.platform.clock import system_clock
from services.runtime.platform.kafka import ensure_topics
from services.runtime.platform.outbox_relay import OutboxRelay
from services.runtime.platform.postgres import apply_migrations, open_pool
from services.runtime.platform.settings import Settings

T = TypeVar("T")
MIGRATIONS = Path(__file__).parent / "migrations"
FLUSH_TIMEOUT_S = 10.0


class UnknownToken(LookupError):
    pass


async def _run(settings: Settings, work: Callable[[KeysTx], Awaitable[T]]) -> T:
    await asyncio.to_thread(apply_migrations, settings.database_url, "keys", MIGRATIONS)  # idempotent
    await ensure_topics(settings)  # a fresh stack: the outbox publishes to them
    pool: AsyncConnectionPool = open_pool(settings.database_url, max_size=2)
    await pool.open(wait=True, timeout=30)
    relay = OutboxRelay(pool, settings, "keys")
    try:
        await relay.open()  # it publishes this command's rows below: no relay loop to stop afterwards
        async with KeysStore(pool, relay).transaction() as tx:
            result = await work(tx)
        # committed: now publish it (and whatever else of the keys outbox waits, in order)
        async with asyncio.timeout(FLUSH_TIMEOUT_S):
            await relay.publish_committed()
        return result
    finally:
        await relay.stop()
        await pool.close()


def _item(row: Row) -> dict[str, Any]:
    def iso(value: datetime | None) -> str | None:
        return None if value is None else value.isoformat()

    return {
        "id": str(row["id"]),
        "name": row["name"],
        "scopes": list(row["scopes"]),
        "created_at": iso(row["created_at"]),
        "last_used_at": iso(row["last_used_at"]),
        "revoked_at": iso(row["revoked_at"]),
    }


async def create(settings: Settings, name: str, scopes: list[ServiceScope]) -> dict[str, str]:
    async def work(tx: KeysTx) -> dict[str, str]:
        row, token, _ = await service_tokens.create(tx, name, scopes, system_clock(), OPERATOR_CLI)
        return {"id": str(row["id"]), "token": token}

    return await _run(settings, work)


async def list_all(settings: Settings) -> list[dict[str, Any]]:
    async def work(tx: KeysTx) -> list[dict[str, Any]]:
        return [_item(r) for r in await tx.list_service_tokens()]

    return await _run(settings, work)


async def revoke(settings: Settings, token_id: UUID) -> None:
    async def work(tx: KeysTx) -> None:
        if await service_tokens.revoke(tx, token_id, system_clock(), OPERATOR_CLI) is None:
            raise UnknownToken(str(token_id))

    await _run(settings, work)


async def is_live(settings: Settings, token_id: UUID) -> bool:
    """Whether the token exists and is not revoked (`tollgate up` reuses its demo token then)."""

    async def work(tx: KeysTx) -> bool:
        return await tx.service_token_is_live(token_id)

    return await _run(settings, work)
