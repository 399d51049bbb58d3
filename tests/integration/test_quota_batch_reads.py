"""(issue 38) On real Postgres and Kafka: counting a batch costs the same statements for 20
accounts as for 2 (the states' reads are set-based, not per account), and publishes the states
and crossings that counting the same events account by account does."""

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import pytest

from contracts.common import Resource
from contracts.events import UsageEvent
from contracts.topics import QUOTA_THRESHOLDS, Topic
from services.quota.app import quota_service
from services.quota.publisher import KafkaPublisher
from services.quota.service import QuotaService
from services.quota.store import QuotaStore, QuotaTx
from tests.support.apps import running_app

pytestmark = pytest.mark.integration


class CountingConnection:
    """A psycopg connection that counts the statements a transaction sends."""

    def __init__(self, conn: Any, log: list[str]) -> None:
        self._conn, self._log = conn, log

    async def execute(self, query: str, *args: Any, **kw: Any) -> Any:
        self._log.append(query)
        return await self._conn.execute(query, *args, **kw)

    @asynccontextmanager
    async def cursor(self, *args: Any, **kw: Any) -> AsyncIterator[Any]:
        async with self._conn.cursor(*args, **kw) as cur:
            yield CountingCursor(cur, self._log)


class CountingCursor:
    def __init__(self, cur: Any, log: list[str]) -> None:
        self._cur, self._log = cur, log

    async def execute(self, query: str, *args: Any, **kw: Any) -> Any:
        self._log.append(query)
        return await self._cur.execute(query, *args, **kw)

    async def fetchall(self) -> list[Any]:
        return list(await self._cur.fetchall())


class CountingStore(QuotaStore):
    def __init__(self, store: QuotaStore) -> None:
        super().__init__(store._pool)
        self.statements: list[str] = []

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[QuotaTx]:
        async with super().transaction() as tx:
            yield QuotaTx(CountingConnection(tx.conn, self.statements))  # type: ignore[arg-type]


class RecordingPublisher(KafkaPublisher):
    """The real publisher, remembering what it sent."""

    def __init__(self, publisher: KafkaPublisher) -> None:
        vars(self).update(vars(publisher))
        self.sent: list[tuple[str, str, dict[str, Any]]] = []

    async def publish(self, topic: Topic, key: str, payload: str) -> None:
        self.sent.append((topic.name, key, json.loads(payload)))
        await super().publish(topic, key, payload)


def service_of(base: QuotaService) -> tuple[QuotaService, CountingStore, RecordingPublisher]:
    store, publisher = CountingStore(base._store), RecordingPublisher(base._publisher)
    return QuotaService(store, publisher, base._clock, base._tz, base._console_url), store, publisher


def batch(accounts: list[uuid.UUID], now: datetime) -> list[UsageEvent]:
    """Usage of two resources per account; ai_tokens crossing whole percents of the free tier's."""
    return [
        UsageEvent(time=now, account_id=a, resource=resource, quantity=quantity, source="t")
        for i, a in enumerate(accounts)
        for resource, quantity in ((Resource.AI_TOKENS, 1_000 * (i + 1) + 7), (Resource.STORAGE_BYTES, 4_096 * (i + 1)))
    ]


def standing(sent: list[tuple[str, str, dict[str, Any]]], accounts: list[uuid.UUID]) -> list[tuple[Any, ...]]:
    """What was published, per account's index instead of its id (the two runs count other accounts)."""
    index = {str(a): i for i, a in enumerate(accounts)}
    found = []
    for topic, _key, value in sent:
        # a crossing's time is the clock's (a state's is the watermark: its events' own time)
        hidden = ("id", "account_id", "time") if topic == QUOTA_THRESHOLDS.name else ("id", "account_id")
        shown = {k: v for k, v in value.items() if k not in hidden}
        found.append((topic, index[value["account_id"]], json.dumps(shown, sort_keys=True)))
    return sorted(found)


async def test_a_batch_of_20_accounts_sends_the_statements_of_2_and_publishes_what_one_by_one_does(settings):
    async with running_app(settings, targets=("quota",)) as (app, _client):
        base = quota_service(app.state.runtime)
        now = datetime.now(UTC)

        few, few_store, _ = service_of(base)
        await few.count(batch(sorted(uuid.uuid4() for _ in range(2)), now))

        many, many_store, many_sent = service_of(base)
        accounts = sorted(uuid.uuid4() for _ in range(20))
        reserved = await many.reserve(accounts[3], Resource.AI_TOKENS, 500, 60)
        many_store.statements.clear()
        many_sent.sent.clear()
        events = batch(accounts, now)
        events.append(events[0])  # one event twice
        settling = UsageEvent(
            time=now, account_id=accounts[3], resource=Resource.AI_TOKENS, quantity=1, source="t", reservation_id=reserved.id
        )
        await many.count([*events, settling])
        # the same statements but one (settling a reservation), however many accounts
        assert len(many_store.statements) == len(few_store.statements) + 1, many_store.statements
        assert any(topic == QUOTA_THRESHOLDS.name for topic, _, _ in many_sent.sent)

        one, _, one_sent = service_of(base)
        twins = sorted(uuid.uuid4() for _ in range(20))
        held = await one.reserve(twins[3], Resource.AI_TOKENS, 500, 60)
        one_sent.sent.clear()
        moved = dict(zip(accounts, twins, strict=True))
        renewed = {e.id: uuid.uuid4() for e in events}  # new event ids: the first run's are processed
        for account in accounts:  # the same events, a batch per account
            mine = [
                e.model_copy(update={"account_id": moved[account], "id": renewed[e.id]})
                for e in events
                if e.account_id == account
            ]
            if account == accounts[3]:
                mine.append(settling.model_copy(update={"account_id": twins[3], "reservation_id": held.id, "id": uuid.uuid4()}))
            await one.count(mine)
        assert standing(many_sent.sent, accounts) == standing(one_sent.sent, twins)
