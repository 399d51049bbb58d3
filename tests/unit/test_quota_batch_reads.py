"""(issue 38) A batch touching many accounts reads each kind (lines, reservations, marks) once and
moves its marks in one write per period, and publishes what counting account by account does."""

import copy
import json
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from contracts.common import Resource
from contracts.events import CallEvent, UsageEvent
from contracts.topics import QUOTA_THRESHOLDS
from services.quota.service import QuotaService
from tests.unit.fakes import FakeClock, FakePublisher, FakeQuotaStore

ACCOUNTS = sorted(uuid.UUID(int=i * 7919 + 1) for i in range(30))
NOVEMBER = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
DECEMBER = datetime(2026, 12, 1, 0, 0, 5, tzinfo=UTC)  # a consumer lag after midnight


def usage(account: uuid.UUID, resource: Resource, quantity: int, when: datetime, **kw: object) -> UsageEvent:
    return UsageEvent(time=when, account_id=account, resource=resource, quantity=quantity, source="test", **kw)


def call(account: uuid.UUID, when: datetime) -> CallEvent:
    return CallEvent(
        time=when, account_id=account, api_key_id=uuid.uuid4(), method="GET", path="/api/geo/projects", status=200,
        ip="1.2.3.4", latency_ms=1,
    )  # fmt: skip


async def primed() -> tuple[QuotaService, FakeQuotaStore, FakePublisher, FakeClock, list[UsageEvent | CallEvent]]:
    """A service whose accounts stand at different points (November's usage, reservations), and a
    batch of December: current usage crossing thresholds, calls, late November events crossing
    November's, reservations settled, duplicates."""
    store, publisher, clock = FakeQuotaStore(), FakePublisher(), FakeClock(NOVEMBER)
    service = QuotaService(store, publisher, clock, ZoneInfo("UTC"), "https://console.test")  # type: ignore[arg-type]
    await service.count([usage(a, Resource.AI_TOKENS, 1_000 * i, NOVEMBER) for i, a in enumerate(ACCOUNTS)])
    clock.now = DECEMBER
    held = {a: await service.reserve(a, Resource.AI_TOKENS, 500 + i, 3600) for i, a in enumerate(ACCOUNTS) if i % 3 == 0}
    batch: list[UsageEvent | CallEvent] = []
    for i, a in enumerate(ACCOUNTS):
        settles = {"reservation_id": held[a].id} if a in held else {}
        batch.append(usage(a, Resource.AI_TOKENS, 3_000 * i + 7, DECEMBER, **settles))
        batch.append(usage(a, Resource.STORAGE_BYTES, 10_000 * (i + 1), DECEMBER))
        batch += [call(a, DECEMBER) for _ in range(i % 4)]
        if i % 2:
            batch.append(usage(a, Resource.AI_TOKENS, 2_500 * i, datetime(2026, 11, 30, 23, 59, 58, tzinfo=UTC)))
    batch += batch[:5]  # a batch may hold one event twice
    store.calls.clear()
    publisher.sent.clear()
    return service, store, publisher, clock, batch


def by_record(publisher: FakePublisher) -> dict[tuple[str, str], list[dict[str, object]]]:
    """What each record key received, in order (Kafka orders a key's records, not across keys);
    a state's own id is new each time (a crossing's is deterministic)."""
    found: dict[tuple[str, str], list[dict[str, object]]] = defaultdict(list)
    for topic, key, payload in publisher.sent:
        value = json.loads(payload)
        if topic is not QUOTA_THRESHOLDS:
            del value["id"]
        found[topic.name, key].append(value)
    return found


async def test_a_batch_of_many_accounts_reads_each_kind_once_and_publishes_what_one_by_one_does():
    service, store, publisher, clock, batch = await primed()
    one_store, one_publisher = copy.deepcopy(store), FakePublisher()
    one_service = QuotaService(one_store, one_publisher, clock, ZoneInfo("UTC"), "https://console.test")  # type: ignore[arg-type]
    await service.count(batch)
    # the current period's states: one read of each kind; the late November crossings: one more
    # of lines and marks; the marks moved in one write per period
    assert store.calls == {"lines": 2, "marks": 2, "reserved": 1, "set_marks": 2}
    assert any(topic is QUOTA_THRESHOLDS for topic, _, _ in publisher.sent)

    for account in ACCOUNTS:  # the same events, a batch per account
        await one_service.count([e for e in batch if e.account_id == account])
    assert by_record(publisher) == by_record(one_publisher)
    announced = [json.loads(p)["period"] for t, _, p in publisher.sent if t is QUOTA_THRESHOLDS]
    assert {"2026-11", "2026-12"} <= set(announced)
    for table in ("counters", "threshold_marks", "reservations", "processed"):
        assert getattr(store, table) == getattr(one_store, table), table


async def test_a_redelivered_batch_counts_nothing_announces_nothing_and_republishes_the_states():
    service, store, publisher, clock, batch = await primed()
    await service.count(batch)
    counters, marks, first = dict(store.counters), dict(store.threshold_marks), by_record(publisher)
    publisher.sent.clear()
    clock.now = DECEMBER + timedelta(seconds=1)
    await service.count(batch)
    assert (store.counters, store.threshold_marks) == (counters, marks)
    again = by_record(publisher)
    assert not [k for k in again if k[0] == QUOTA_THRESHOLDS.name]
    assert {k: v[-1:] for k, v in again.items()} == {k: v[-1:] for k, v in first.items() if k[0] != QUOTA_THRESHOLDS.name}
