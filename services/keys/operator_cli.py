"""The operator's `tollgate service-token ...` commands, run without any HTTP server: straight
to Postgres (the keys schema and its outbox) and Kafka. Each command commits its row and outbox
row in one transaction and flushes the outbox itself, so a revocation is in Kafka (and thus in
force on every replica within milliseconds) when the command returns."""

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

from psycopg_pool import AsyncConnectionPool

from contracts.audit import OPERATOR_CLI
from contracts.common import ServiceScope
from contracts.events import PlanChanged, ServiceTokenState
from contracts.topics import KEYS
from services.edge import share_token_revocation, shared_revocations
from services.keys import service_tokens
from services.keys.published import RECONCILED_TOPICS, Published
from services.keys.service import REPUBLISHED_TOPICS, Changes, KeysService
from services.keys.store import KeysStore, KeysTx, Row
from services.runtime.platform.clock import system_clock
from services.runtime.platform.kafka import ensure_topics
from services.runtime.platform.outbox_relay import OutboxRelay
from services.runtime.platform.postgres import apply_migrations, open_pool
from services.runtime.platform.settings import Settings
from services.runtime.platform.topic_follower import TopicFollower

log = logging.getLogger(__name__)

T = TypeVar("T")
MIGRATIONS = Path(__file__).parent / "migrations"
FLUSH_TIMEOUT_S = 10.0


class UnknownToken(LookupError):
    pass


@asynccontextmanager
async def _outbox(settings: Settings) -> AsyncIterator[tuple[AsyncConnectionPool, OutboxRelay]]:
    """The keys schema (migrated) and its outbox relay's producer, for one command."""
    await asyncio.to_thread(apply_migrations, settings.database_url, "keys", MIGRATIONS)  # idempotent
    await ensure_topics(settings)  # a fresh stack: the outbox publishes to them
    pool: AsyncConnectionPool = open_pool(settings.database_url, max_size=2)
    await pool.open(wait=True, timeout=30)
    relay = OutboxRelay(pool, settings, "keys")
    try:
        await relay.open()  # it publishes this command's rows: no relay loop to stop afterwards
        yield pool, relay
    finally:
        await relay.stop()
        await pool.close()


async def _run(settings: Settings, work: Callable[[KeysTx], Awaitable[T]]) -> T:
    async with _outbox(settings) as (pool, relay):
        async with KeysStore(pool, relay).transaction() as tx:
            result = await work(tx)
        # committed: now publish it (and whatever else of the keys outbox waits, in order)
        async with asyncio.timeout(FLUSH_TIMEOUT_S):
            await relay.publish_committed()
        return result


class _Flush:
    """The use cases' LocalEdge in a process without an edge: delivering is publishing the outbox."""

    def __init__(self, relay: OutboxRelay) -> None:
        self._relay = relay

    async def deliver(self, changes: Changes) -> None:
        await self._relay.publish_committed()

    def knows_account(self, account_id: UUID) -> bool:
        return False

    def latest_plan(self, account_id: UUID) -> PlanChanged | None:
        return None

    def issue_session(self, account_id: UUID, session_id: str, now: datetime, user_id: UUID) -> str:
        raise NotImplementedError("the operator's CLI issues no sessions")

    def drain_service_token_uses(self) -> dict[UUID, datetime]:
        return {}

    def note_service_token_use(self, token_id: UUID, at: datetime) -> None:
        pass


async def republish(settings: Settings, topics: Collection[str] = REPUBLISHED_TOPICS) -> dict[str, int]:
    """`tollgate republish`: every state of the keys service's topics again, from Postgres, and
    reconciled with what those topics hold (a restore to an older point: services/keys/reconcile.py)."""
    async with _outbox(settings) as (pool, relay):
        service = KeysService(
            KeysStore(pool, relay), _Flush(relay), system_clock, session_ttl_seconds=settings.session_ttl_seconds
        )
        return await service.republish(topics, await _published(settings, topics))


async def _published(settings: Settings, topics: Collection[str]) -> Published:
    """What the reconciled topics among `topics` hold, read to their end offsets as of now."""
    published = Published()
    wanted = [t for t in RECONCILED_TOPICS if t in topics]
    if not wanted:
        return published
    follower = TopicFollower(
        settings.kafka_bootstrap_servers,
        {settings.topic(t): functools.partial(published.apply, t) for t in wanted},
    )
    await follower.start()
    try:
        await follower.caught_up.wait()
    finally:
        await follower.stop()
    if KEYS.name in wanted and settings.redis_url:  # the limiter store's witnesses of ends
        published.keys.apply_revocations(await shared_revocations(settings.redis_url))
    return published


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
    async def work(tx: KeysTx) -> ServiceTokenState:
        state = await service_tokens.revoke(tx, token_id, system_clock(), OPERATOR_CLI)
        if state is None:
            raise UnknownToken(str(token_id))
        return state

    state = await _run(settings, work)
    if settings.redis_url:  # refused by every replica, whatever its Kafka consumer has read (as the API's)
        try:
            await share_token_revocation(settings.redis_url, state.token_id, state.version)
        except Exception:
            log.warning("the revocation could not be shared (Redis): service-tokens.v1 carries it alone", exc_info=True)


async def is_live(settings: Settings, token_id: UUID) -> bool:
    """Whether the token exists and is not revoked (`tollgate up` reuses its demo token then)."""

    async def work(tx: KeysTx) -> bool:
        return await tx.service_token_is_live(token_id)

    return await _run(settings, work)
