"""(issue 38) A batch touching many accounts reads each kind (lines, reservations, marks) once and
moves its marks in one write per period, and publishes what counting account by account does; so
do the states of many keys' lineages (rules, versions, reservations, counters; the marks in one
write)."""

import copy
import json
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from contracts.common import Resource, Role
from contracts.events import CallEvent, KeyState, UsageEvent
from contracts.key_limits import KeyLimit, LimitPeriod
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


# ---- (issue 38) the key lineages' states: set-based too -------------------------------------------
KEY_ACCOUNTS = ACCOUNTS[:12]
THURSDAY = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def limits_of(i: int) -> list[KeyLimit]:
    """Limits of every period, on calls and tokens, small enough that a batch crosses some of them."""
    periods = list(LimitPeriod)
    return [
        KeyLimit(resource=Resource.API_CALLS, amount=5 + i % 4, period=periods[i % len(periods)]),
        KeyLimit(resource=Resource.AI_TOKENS, amount=1_000 * (i + 1), period=periods[(i + 1) % len(periods)]),
        KeyLimit(resource=Resource.AI_TOKENS, amount=50_000, period=periods[(i + 2) % len(periods)]),
    ][: 1 + i % 3]


async def keyed() -> tuple[QuotaService, FakeQuotaStore, FakePublisher, FakeClock, list[UsageEvent | CallEvent]]:
    """Accounts with two key lineages each (one rotated: two live keys, the new one's limit
    narrower), usage already counted, reservations held by keys, and a batch of calls and usage
    on the keys: crossings, settled reservations, duplicates."""
    store, publisher, clock = FakeQuotaStore(), FakePublisher(), FakeClock(THURSDAY)
    service = QuotaService(store, publisher, clock, ZoneInfo("UTC"), "https://console.test")  # type: ignore[arg-type]
    keys: dict[uuid.UUID, list[uuid.UUID]] = {}
    n = 0
    for i, account in enumerate(KEY_ACCOUNTS):
        first, second, successor = (uuid.UUID(int=(i + 1) * 1_000 + j) for j in range(3))
        keys[account] = [first, second, successor]
        for key, limits, lineage in ((first, limits_of(n), None), (second, limits_of(n + 1), None)):
            await service.apply_key(key_state(account, key, limits, lineage_id=lineage))
        narrower = [limit.model_copy(update={"amount": max(limit.amount // 2, 1)}) for limit in limits_of(n + 1)]
        await service.apply_key(key_state(account, successor, narrower, lineage_id=second))
        n += 2
        await service.count([key_tokens(account, first, 100 * i, THURSDAY)])
    held = {}
    for i, account in enumerate(KEY_ACCOUNTS):
        if i % 3 < 2:  # held by the rotated lineage's new key; the batch settles half of them
            held[account] = await service.reserve(account, Resource.AI_TOKENS, 10 + i, 3600, api_key_id=keys[account][2])
    batch: list[UsageEvent | CallEvent] = []
    for i, account in enumerate(KEY_ACCOUNTS):
        first, second, successor = keys[account]
        settles = {"reservation_id": held[account].id} if account in held and i % 2 == 0 else {}
        batch.append(key_tokens(account, successor, 400 * i + 3, THURSDAY, **settles))
        batch.append(key_tokens(account, first, 700 * (i + 1), THURSDAY))
        batch += [key_call(account, key, THURSDAY) for key in (first, second, successor) for _ in range(i % 5)]
    batch += batch[:4]
    store.calls.clear()
    publisher.sent.clear()
    return service, store, publisher, clock, batch


def key_state(account: uuid.UUID, key: uuid.UUID, limits: list[KeyLimit], lineage_id: uuid.UUID | None) -> KeyState:
    return KeyState(
        time=THURSDAY, account_id=account, key_id=key, hash="a" * 64, status="enabled", roles=[Role.OWNER],
        limits=limits, version=1, lineage_id=lineage_id,
    )  # fmt: skip


def key_tokens(account: uuid.UUID, key: uuid.UUID, quantity: int, when: datetime, **kw: object) -> UsageEvent:
    return usage(account, Resource.AI_TOKENS, quantity, when, api_key_id=key, **kw)


def key_call(account: uuid.UUID, key: uuid.UUID, when: datetime) -> CallEvent:
    return call(account, when).model_copy(update={"api_key_id": key})


async def test_a_batch_of_many_keys_reads_each_kind_of_their_states_once_and_publishes_what_one_by_one_does():
    service, store, publisher, clock, batch = await keyed()
    one_store, one_publisher = copy.deepcopy(store), FakePublisher()
    one_service = QuotaService(one_store, one_publisher, clock, ZoneInfo("UTC"), "https://console.test")  # type: ignore[arg-type]
    await service.count(batch)
    # 24 lineages of 36 keys: their rules, versions, reservations and counters read once, the
    # marks moved in one write (was a version, a reservations read, a counter read per limit and
    # a write per crossing, for each lineage)
    keyed_calls = {k: v for k, v in store.calls.items() if k not in ("lines", "marks", "reserved", "set_marks")}
    assert keyed_calls == dict.fromkeys(
        ("lineage_rules", "next_key_state_versions", "key_reserved", "key_lines", "set_key_marks"), 1
    )
    sent = by_record(publisher)
    key_records = [k for k in sent if k[1].startswith("key:")]
    assert len(key_records) >= 30 and any(v["blocked"] for k in key_records for v in sent[k])
    assert any(v["reserved"] for k in key_records for v in sent[k])
    crossings = [v for (topic, _), vs in sent.items() if topic == QUOTA_THRESHOLDS.name for v in vs if v.get("api_key_id")]
    assert len({c["api_key_id"] for c in crossings}) >= 10  # keys' crossings, a rotated lineage's for both keys

    for account in KEY_ACCOUNTS:  # the same events, a batch per account
        await one_service.count([e for e in batch if e.account_id == account])
    assert by_record(publisher) == by_record(one_publisher)
    for table in ("counters", "key_counters", "lineage_versions", "reservations", "processed", "threshold_marks"):
        assert getattr(store, table) == getattr(one_store, table), table


async def test_a_redelivered_batch_of_many_keys_announces_nothing_and_republishes_their_states_with_new_versions():
    service, store, publisher, _clock, batch = await keyed()
    await service.count(batch)
    counters, first = copy.deepcopy(store.key_counters), by_record(publisher)
    publisher.sent.clear()
    await service.count(batch)
    assert store.key_counters == counters
    again = by_record(publisher)
    assert not [k for k in again if k[0] == QUOTA_THRESHOLDS.name]
    for record, states in again.items():
        if record[1].startswith("key:"):
            (last,) = first[record][-1:]
            assert states[-1] == {**last, "version": last["version"] + 1}
