"""(issue 38) On real Postgres and Kafka: counting a batch costs the same statements for 20
accounts as for 2 (the states' reads are set-based, not per account), and publishes the states
and crossings that counting the same events account by account does; so does a batch charging 20
keys with limits of their own (their lineages' states read set-based too)."""

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import pytest

from contracts.common import Resource, Role
from contracts.events import CallEvent, KeyState, UsageEvent
from contracts.key_limits import KeyLimit, LimitPeriod
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


# ---- (issue 38) the key lineages' states: set-based too -------------------------------------------
def key_limits(i: int) -> list[KeyLimit]:
    """A day limit on tokens that a batch crosses, and for every other key a month limit on calls too."""
    day = KeyLimit(resource=Resource.AI_TOKENS, amount=50_000, period=LimitPeriod.DAY)
    return [day, KeyLimit(resource=Resource.API_CALLS, amount=100, period=LimitPeriod.MONTH)][: 1 + i % 2]


async def with_keys(service: QuotaService, accounts: list[uuid.UUID], now: datetime) -> list[uuid.UUID]:
    """A key with limits of its own per account, as keys.v1 hands it to quota."""
    keys = sorted(uuid.uuid4() for _ in accounts)
    for i, (account, key) in enumerate(zip(accounts, keys, strict=True)):
        state = KeyState(
            time=now, account_id=account, key_id=key, hash="a" * 64, status="enabled", roles=[Role.OWNER],
            limits=key_limits(i), version=1,
        )  # fmt: skip
        await service.apply_key(state)
    return keys


def keyed_batch(accounts: list[uuid.UUID], keys: list[uuid.UUID], now: datetime) -> list[UsageEvent | CallEvent]:
    """Each key's tokens (crossing whole percents of its day limit) and calls."""
    events: list[UsageEvent | CallEvent] = []
    for i, (account, key) in enumerate(zip(accounts, keys, strict=True)):
        tokens = 1_000 * (i + 1) + 7  # crossing whole percents of the account's free tier too
        events.append(
            UsageEvent(time=now, account_id=account, resource=Resource.AI_TOKENS, quantity=tokens, source="t", api_key_id=key)
        )
        events += [key_call(account, key, now) for _ in range(1 + i % 3)]
    return events


def key_call(account: uuid.UUID, key: uuid.UUID, now: datetime) -> CallEvent:
    return CallEvent(
        time=now, account_id=account, api_key_id=key, method="GET", path="/api/geo/projects", status=200, ip="1.2.3.4",
        latency_ms=1,
    )  # fmt: skip


def key_standing(
    sent: list[tuple[str, str, dict[str, Any]]], accounts: list[uuid.UUID], keys: list[uuid.UUID]
) -> list[tuple[Any, ...]]:
    """What was published of the keys (their states and crossings), per index of account and key."""
    index = {str(a): i for i, a in enumerate(accounts)} | {str(k): i for i, k in enumerate(keys)}
    found = []
    for topic, _key, value in sent:
        if value.get("api_key_id") is None:
            continue
        hidden = (
            ("id", "account_id", "api_key_id", "time") if topic == QUOTA_THRESHOLDS.name else ("id", "account_id", "api_key_id")
        )
        shown = {k: v for k, v in value.items() if k not in hidden}
        found.append((topic, index[value["account_id"]], index[value["api_key_id"]], json.dumps(shown, sort_keys=True)))
    return sorted(found)


async def test_a_batch_of_20_keys_sends_the_statements_of_2_and_publishes_their_states_as_one_by_one_does(settings):
    async with running_app(settings, targets=("quota",)) as (app, _client):
        base = quota_service(app.state.runtime)
        now = datetime.now(UTC)

        few, few_store, _ = service_of(base)
        few_accounts = sorted(uuid.uuid4() for _ in range(2))
        few_keys = await with_keys(few, few_accounts, now)
        few_store.statements.clear()
        await few.count(keyed_batch(few_accounts, few_keys, now))

        many, many_store, many_sent = service_of(base)
        accounts = sorted(uuid.uuid4() for _ in range(20))
        keys = await with_keys(many, accounts, now)
        many_store.statements.clear()
        many_sent.sent.clear()
        await many.count(keyed_batch(accounts, keys, now))
        # however many keys (with limits on one or two resources and periods): the same statements
        assert len(many_store.statements) == len(few_store.statements), many_store.statements
        published = key_standing(many_sent.sent, accounts, keys)
        assert sum(1 for topic, *_ in published if topic == QUOTA_THRESHOLDS.name) >= 10
        assert sum(1 for topic, *_ in published if topic != QUOTA_THRESHOLDS.name) == 30

        one, _, one_sent = service_of(base)
        twins = sorted(uuid.uuid4() for _ in range(20))
        twin_keys = await with_keys(one, twins, now)
        one_sent.sent.clear()
        for i in range(len(accounts)):  # the same events, a batch per account (its one key)
            events = keyed_batch(accounts, keys, now)
            await one.count(
                [
                    e.model_copy(update={"account_id": twins[i], "api_key_id": twin_keys[i], "id": uuid.uuid4()})
                    for e in events
                    if e.account_id == accounts[i]
                ]
            )
        assert key_standing(many_sent.sent, accounts, keys) == key_standing(one_sent.sent, twins, twin_keys)
