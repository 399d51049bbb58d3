"""GEO projects' use cases: list, create within the `geo_projects` total, delete. Each change
and its usage.v1 delta (an outbox row) commit in one transaction; the relay publishes it."""

from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID, uuid4

from contracts.clock import Clock
from contracts.common import Resource
from contracts.domain_errors import NotFound
from contracts.topics import USAGE, Topic
from services.geo import domain
from services.geo.store import ProjectRow


class Tx(Protocol):
    """What the use cases do inside one transaction (store.GeoTx; a fake in the unit tests)."""

    @property
    def conn(self) -> Any: ...
    async def list_projects(self, account_id: UUID) -> list[ProjectRow]: ...
    async def insert_project(self, project_id: UUID, account_id: UUID, name: str, now: datetime) -> ProjectRow: ...
    async def delete_project(self, account_id: UUID, project_id: UUID) -> bool: ...
    async def lock_account(self, account_id: UUID) -> None: ...
    async def count_projects(self, account_id: UUID) -> int: ...


class Store(Protocol):
    def transaction(self) -> AbstractAsyncContextManager[Tx]: ...
    def read(self) -> AbstractAsyncContextManager[Tx]: ...


class Outbox(Protocol):
    async def add(self, conn: Any, topic: Topic, key: bytes, value: bytes | None) -> int: ...
    def wake(self) -> None: ...


class Quota(Protocol):
    """The edge's quota projection: an account's (used, total) and the period's end (the total from
    billing.v1, in force as soon as a payment answers; services/edge/billing_totals.py)."""

    def standing(self, account_id: UUID, resource: Resource, now: datetime) -> tuple[int, int]: ...
    def period_end(self, now: datetime) -> datetime: ...


class GeoService:
    def __init__(self, store: Store, outbox: Outbox, quota: Quota, clock: Clock, console_url: str) -> None:
        self.store = store
        self.outbox = outbox
        self.quota = quota
        self.clock = clock
        self.console_url = console_url  # for the links of insufficient_quota

    async def list_projects(self, account_id: UUID) -> list[ProjectRow]:
        async with self.store.read() as tx:
            return await tx.list_projects(account_id)

    async def create_project(self, account_id: UUID, name: str) -> ProjectRow:
        """Exact under any concurrency: the account's creations are serialised by a lock in geo's
        own transaction (on every replica) and its live projects counted against the total."""
        now = self.clock()
        _, total = self.quota.standing(account_id, domain.RESOURCE, now)
        async with self.store.transaction() as tx:
            await tx.lock_account(account_id)
            live = await tx.count_projects(account_id)
            if not domain.may_create(live, total):
                raise domain.ProjectsExhausted(live, total, self.quota.period_end(now), self.console_url)
            row = await tx.insert_project(uuid4(), account_id, name, now)
            await self._emit(tx, account_id, +1, now)
        self.outbox.wake()
        return row

    async def delete_project(self, account_id: UUID, project_id: UUID) -> None:
        async with self.store.transaction() as tx:
            if not await tx.delete_project(account_id, project_id):
                raise NotFound("project")
            await self._emit(tx, account_id, -1, self.clock())
        self.outbox.wake()

    async def _emit(self, tx: Tx, account_id: UUID, delta: int, now: datetime) -> None:
        event = domain.usage_delta(account_id, delta, now)
        await self.outbox.add(tx.conn, USAGE, str(account_id).encode(), event.model_dump_json().encode())
