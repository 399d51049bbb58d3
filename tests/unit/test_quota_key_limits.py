"""(v4) Limits per key in services/quota/service.py on fakes: learning them from keys.v1, counting
usage and calls against the key and the account at once, reservations judged on both scopes,
windows that reset (and `once`, which never does), crossings of a key's limit, removal."""

import json
import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from contracts.common import Resource, Role
from contracts.domain_errors import Forbidden, NotFound
from contracts.events import CallEvent, KeyState, UsageEvent
from contracts.key_limits import KeyLimit, LimitPeriod
from contracts.topics import QUOTA, QUOTA_THRESHOLDS
from services.quota.service import QuotaService
from tests.unit.fakes import FakeClock, FakePublisher, FakeQuotaStore

CONSOLE = "https://console.test"
T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)  # a Thursday


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def publisher() -> FakePublisher:
    return FakePublisher()


@pytest.fixture
def edge_keys() -> dict[uuid.UUID, KeyState]:
    """The keys.v1 states this process's edge holds, by key id (KeyProjection.by_id)."""
    return {}


@pytest.fixture
def service(clock: FakeClock, publisher: FakePublisher, edge_keys: dict[uuid.UUID, KeyState]) -> QuotaService:
    return QuotaService(
        FakeQuotaStore(),  # type: ignore[arg-type]
        publisher,  # type: ignore[arg-type]
        clock,
        ZoneInfo("UTC"),
        CONSOLE,
        keys=edge_keys.get,
        key_news_bound_s=0.05,
    )


def key_state(account: uuid.UUID, key: uuid.UUID, limits: list[KeyLimit], version: int = 1, **kw: object) -> KeyState:
    return KeyState(
        time=T0,
        account_id=account,
        key_id=key,
        hash="a" * 64,
        status="enabled",
        roles=[Role.OWNER],
        limits=limits,
        version=version,
        **kw,  # type: ignore[arg-type]
    )


def tokens(account: uuid.UUID, key: uuid.UUID | None, quantity: int, when: datetime, **kw: object) -> UsageEvent:
    return UsageEvent(
        time=when,
        account_id=account,
        resource=Resource.AI_TOKENS,
        quantity=quantity,
        source="t",
        api_key_id=key,
        **kw,  # type: ignore[arg-type]
    )


def call(account: uuid.UUID, key: uuid.UUID, when: datetime, status: int = 200) -> CallEvent:
    return CallEvent(
        time=when, account_id=account, api_key_id=key, method="GET", path="/x", status=status, ip="1.2.3.4", latency_ms=1
    )


def key_states(publisher: FakePublisher, key: uuid.UUID) -> list[dict]:
    return [json.loads(p) for t, k, p in publisher.sent if t is QUOTA and k.startswith(f"key:{key}:")]


def last_state(publisher: FakePublisher, key: uuid.UUID, resource: Resource, period: LimitPeriod) -> dict:
    return [s for s in key_states(publisher, key) if s["resource"] == resource.value and s["period"] == period.value][-1]


def month(amount: int, resource: Resource = Resource.AI_TOKENS) -> KeyLimit:
    return KeyLimit(resource=resource, amount=amount, period=LimitPeriod.MONTH)


async def test_usage_of_a_key_counts_against_its_limits_and_the_account_once_per_event(service, publisher):
    account, key = uuid.uuid4(), uuid.uuid4()
    day = KeyLimit(resource=Resource.AI_TOKENS, amount=500, period=LimitPeriod.DAY)
    await service.apply_key(key_state(account, key, [month(1_000), day]))
    first = tokens(account, key, 300, T0)
    await service.count([first, first, tokens(account, None, 50, T0)])
    await service.count([first])  # redelivered: counted once
    state = last_state(publisher, key, Resource.AI_TOKENS, LimitPeriod.MONTH)
    assert (state["used"], state["amount"], state["window"], state["blocked"]) == (300, 1_000, "2026-11", False)
    assert state["resets_at"].startswith("2026-12-01T00:00:00")
    daily = last_state(publisher, key, Resource.AI_TOKENS, LimitPeriod.DAY)
    assert (daily["used"], daily["window"]) == (300, "2026-11-26")
    report = await service.report(account)
    assert next(i.used for i in report.items if i.resource is Resource.AI_TOKENS) == 350  # the account's too


async def test_admitted_calls_count_against_an_api_calls_limit_refused_ones_do_not(service, publisher):
    account, key = uuid.uuid4(), uuid.uuid4()
    await service.apply_key(key_state(account, key, [month(2, Resource.API_CALLS)]))
    await service.count([call(account, key, T0), call(account, key, T0, status=429), call(account, key, T0)])
    state = last_state(publisher, key, Resource.API_CALLS, LimitPeriod.MONTH)
    assert (state["used"], state["blocked"]) == (2, True)


async def test_a_key_of_another_account_is_never_charged(service, publisher):
    account, other, key = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await service.apply_key(key_state(account, key, [month(1_000)]))
    await service.count([tokens(other, key, 900, T0)])  # another tenant's event naming this key
    assert last_state(publisher, key, Resource.AI_TOKENS, LimitPeriod.MONTH)["used"] == 0


async def test_a_day_limit_starts_from_zero_in_a_new_day_and_once_never_refills(service, publisher, clock):
    account, key = uuid.uuid4(), uuid.uuid4()
    day = KeyLimit(resource=Resource.AI_TOKENS, amount=100, period=LimitPeriod.DAY)
    once = KeyLimit(resource=Resource.AI_TOKENS, amount=150, period=LimitPeriod.ONCE)
    await service.apply_key(key_state(account, key, [day, once]))
    await service.count([tokens(account, key, 100, T0)])
    assert last_state(publisher, key, Resource.AI_TOKENS, LimitPeriod.DAY)["blocked"]
    await service.expire_all()  # the sweeper's first pass in this process: the day it runs in
    clock.now = T0 + timedelta(days=1)
    await service.expire_all()  # a new day: every limited key's states again, in their new windows
    daily = last_state(publisher, key, Resource.AI_TOKENS, LimitPeriod.DAY)
    assert (daily["window"], daily["used"], daily["blocked"]) == ("2026-11-27", 0, False)
    once_state = last_state(publisher, key, Resource.AI_TOKENS, LimitPeriod.ONCE)
    assert (once_state["window"], once_state["used"], once_state["resets_at"]) == ("once", 100, None)
    await service.count([tokens(account, key, 50, clock())])
    assert last_state(publisher, key, Resource.AI_TOKENS, LimitPeriod.ONCE)["blocked"]  # 150 of 150, for good


async def test_a_reservation_is_refused_by_the_key_limit_or_the_account_with_its_scope(service, publisher):
    account, key = uuid.uuid4(), uuid.uuid4()
    await service.apply_key(key_state(account, key, [month(1_000)]))
    held = await service.reserve(account, Resource.AI_TOKENS, 800, 60, api_key_id=key)
    assert last_state(publisher, key, Resource.AI_TOKENS, LimitPeriod.MONTH)["reserved"] == 800
    with pytest.raises(Forbidden) as refused:
        await service.reserve(account, Resource.AI_TOKENS, 201, 60, api_key_id=key)
    details = refused.value.details
    assert details["scope"] == "api_key" and (details["total"], details["used"], details["reserved"]) == (1_000, 0, 800)
    assert details["period_end"].startswith("2026-12-01") and details["limit_period"] == "month"
    await service.reserve(account, Resource.AI_TOKENS, 200, 60, api_key_id=key)  # exactly fits
    # the account: the free tier's 100,000 tokens, whatever the key's limit says
    with pytest.raises(Forbidden) as refused:
        await service.reserve(account, Resource.AI_TOKENS, 100_000, 60)
    assert refused.value.details["scope"] == "account"
    # settling frees the key's part: the actual quantity is counted in its window
    await service.count([tokens(account, key, 500, T0, reservation_id=held.id)])
    state = last_state(publisher, key, Resource.AI_TOKENS, LimitPeriod.MONTH)
    assert (state["used"], state["reserved"]) == (500, 200)


async def test_release_and_expiry_free_the_keys_part(service, publisher, clock):
    account, key = uuid.uuid4(), uuid.uuid4()
    await service.apply_key(key_state(account, key, [month(1_000)]))
    held = await service.reserve(account, Resource.AI_TOKENS, 1_000, 60, api_key_id=key)
    assert last_state(publisher, key, Resource.AI_TOKENS, LimitPeriod.MONTH)["blocked"]
    assert await service.release(held.id)
    assert last_state(publisher, key, Resource.AI_TOKENS, LimitPeriod.MONTH)["reserved"] == 0
    await service.reserve(account, Resource.AI_TOKENS, 1_000, 1, api_key_id=key)
    clock.now = T0 + timedelta(seconds=2)
    await service.expire_all()
    assert last_state(publisher, key, Resource.AI_TOKENS, LimitPeriod.MONTH)["reserved"] == 0


async def test_a_key_not_of_the_account_is_not_found_whether_quota_knows_it_or_not(service, edge_keys):
    """Another account's key (known to quota, or only to the edge) and a key nobody has heard of
    answer the same NotFound, and nothing is held: before, an unknown id was accepted."""
    account, other, known, edge_only = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await service.apply_key(key_state(other, known, [month(1_000)]))
    edge_keys[edge_only] = key_state(other, edge_only, [])
    for key in (known, edge_only, uuid.uuid4()):
        with pytest.raises(NotFound):
            await service.reserve(account, Resource.AI_TOKENS, 1, 60, api_key_id=key)
    assert service._store.reservations == {}  # type: ignore[attr-defined]


async def test_a_key_only_the_edge_has_heard_of_is_learned_with_its_limits(service, edge_keys, publisher):
    """Verify handed out the key's id from an edge that has its keys.v1 state; quota's consumer has
    not applied it yet. The reservation takes the state from this process's edge, limits included."""
    account, key = uuid.uuid4(), uuid.uuid4()
    edge_keys[key] = key_state(account, key, [month(1_000)])
    with pytest.raises(Forbidden) as refused:
        await service.reserve(account, Resource.AI_TOKENS, 1_001, 60, api_key_id=key)
    assert refused.value.details["scope"] == "api_key"
    await service.reserve(account, Resource.AI_TOKENS, 1_000, 60, api_key_id=key)
    assert last_state(publisher, key, Resource.AI_TOKENS, LimitPeriod.MONTH)["reserved"] == 1_000


async def test_a_keys_crossings_name_the_key_the_limit_and_the_window(service, publisher):
    account, key = uuid.uuid4(), uuid.uuid4()
    await service.apply_key(key_state(account, key, [month(1_000)]))
    await service.count([tokens(account, key, 950, T0)])
    crossed = [json.loads(p) for t, _k, p in publisher.sent if t is QUOTA_THRESHOLDS and json.loads(p)["api_key_id"]]
    assert [(c["threshold_pct"], c["total"], c["limit_period"], c["window"]) for c in crossed] == [
        (95, 1_000, "month", "2026-11")
    ]
    await service.count([tokens(account, key, 10, T0)])  # 96%: once more, higher
    await service.count([tokens(account, key, 1, T0)])  # still 96%: nothing
    crossed = [
        json.loads(p)["threshold_pct"] for t, _k, p in publisher.sent if t is QUOTA_THRESHOLDS and json.loads(p)["api_key_id"]
    ]
    assert crossed == [95, 96]


def key_crossings(publisher: FakePublisher) -> list[tuple[int, int]]:
    return [
        (c["threshold_pct"], c["total"])
        for c in (json.loads(p) for t, _k, p in publisher.sent if t is QUOTA_THRESHOLDS)
        if c["api_key_id"]
    ]


async def test_narrowing_a_keys_limit_announces_the_thresholds_it_crosses_once_and_widening_none(service, publisher):
    """As an account's downgrade does: a narrower limit raises the key's rate, and the highest
    percent usage now stands across is announced (alerts fires each rule at or below it), once;
    before, the mark moved there silently and the key's 80% rule never fired. A wider limit lowers
    the rate silently, and crossings are announced again from there."""
    account, key = uuid.uuid4(), uuid.uuid4()
    await service.apply_key(key_state(account, key, [month(1_000)]))
    await service.count([tokens(account, key, 450, T0)])  # 45%
    assert key_crossings(publisher) == [(45, 1_000)]
    await service.apply_key(key_state(account, key, [month(500)], version=2))  # 450 of 500: 90%
    assert key_crossings(publisher)[1:] == [(90, 500)]
    await service.apply_key(key_state(account, key, [month(500)], version=3))  # same amount again: nothing
    await service.apply_key(key_state(account, key, [month(400)], version=4))  # past the limit: 100%
    assert key_crossings(publisher)[1:] == [(90, 500), (100, 400)]
    await service.apply_key(key_state(account, key, [month(900)], version=5))  # wider: 50%, silent
    assert key_crossings(publisher)[1:] == [(90, 500), (100, 400)]
    await service.count([tokens(account, key, 10, T0)])  # 460 of 900: 51%, announced from the new mark
    assert key_crossings(publisher)[1:] == [(90, 500), (100, 400), (51, 900)]


async def test_a_new_limit_announces_nothing_for_usage_before_it(service, publisher):
    account, key = uuid.uuid4(), uuid.uuid4()
    await service.apply_key(key_state(account, key, []))
    await service.count([tokens(account, key, 450, T0)])
    await service.apply_key(key_state(account, key, [month(500)], version=2))
    assert key_crossings(publisher) == []


async def test_a_cleared_limit_is_published_removed_and_older_states_change_nothing(service, publisher):
    account, key = uuid.uuid4(), uuid.uuid4()
    day = KeyLimit(resource=Resource.AI_TOKENS, amount=100, period=LimitPeriod.DAY)
    await service.apply_key(key_state(account, key, [month(1_000), day], version=2))
    await service.apply_key(key_state(account, key, [], version=1))  # older: ignored
    assert not any(s["removed"] for s in key_states(publisher, key))
    await service.apply_key(key_state(account, key, [month(1_000)], version=3))  # the day limit cleared
    assert last_state(publisher, key, Resource.AI_TOKENS, LimitPeriod.DAY)["removed"]
    assert not last_state(publisher, key, Resource.AI_TOKENS, LimitPeriod.MONTH)["removed"]


async def test_a_deleted_keys_usage_counts_for_the_account_only_and_its_lineage_standing_stays(service, publisher):
    """A deleted key removes no standing: the key rotated from it may reach quota after its
    deletion, and must be judged where the lineage stands meanwhile (not from 0)."""
    account, key = uuid.uuid4(), uuid.uuid4()
    await service.apply_key(key_state(account, key, [month(1_000)], version=2))
    await service.count([tokens(account, key, 10, T0)])
    await service.apply_key(key_state(account, key, [month(1_000)], version=3, deleted=True))
    before = len(key_states(publisher, key))
    await service.count([tokens(account, key, 10, T0)])  # a deleted key's usage counts for the account only
    assert len(key_states(publisher, key)) == before
    assert not last_state(publisher, key, Resource.AI_TOKENS, LimitPeriod.MONTH)["removed"]
    assert last_state(publisher, key, Resource.AI_TOKENS, LimitPeriod.MONTH)["used"] == 10


async def test_a_rotated_key_counts_in_its_lineage_whichever_of_the_two_states_comes_first(service, publisher):
    """(v4) A key made by rotation continues its predecessor's lineage: the predecessor's spent
    `once` credits stay spent, the two keys share one counter during the grace period, and a
    reservation with the new key's id is judged where the lineage stands. The old key's deletion
    (rotation with no grace) may reach quota before the new key's state: nothing is removed."""
    once = KeyLimit(resource=Resource.AI_TOKENS, amount=100, period=LimitPeriod.ONCE)
    for new_first in (False, True):
        account, old, new = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
        await service.apply_key(key_state(account, old, [once], version=1))
        await service.count([tokens(account, old, 90, T0)])
        deleted = key_state(account, old, [once], version=2, deleted=True)
        successor = key_state(account, new, [once], version=1, lineage_id=old)
        for state in (successor, deleted) if new_first else (deleted, successor):
            await service.apply_key(state)
        assert not any(s["removed"] for s in key_states(publisher, old))
        assert key_states(publisher, new) == []  # the lineage's standing is published under its id
        await service.count([tokens(account, new, 5, T0)])
        standing = last_state(publisher, old, Resource.AI_TOKENS, LimitPeriod.ONCE)
        assert (standing["used"], standing["api_key_id"]) == (95, str(old))
        with pytest.raises(Forbidden):
            await service.reserve(account, Resource.AI_TOKENS, 6, 60, api_key_id=new)
        held = await service.reserve(account, Resource.AI_TOKENS, 5, 60, api_key_id=new)
        assert last_state(publisher, old, Resource.AI_TOKENS, LimitPeriod.ONCE)["reserved"] == 5
        assert await service.release(held.id)


async def test_a_lineage_crossing_is_announced_for_each_of_its_live_keys_with_the_limit(service, publisher):
    """Alert rules name a key: during a rotation's grace both keys' rules hear of the lineage's crossing."""
    account, old, new = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await service.apply_key(key_state(account, old, [month(100)], version=1))
    await service.apply_key(key_state(account, new, [month(100)], version=1, lineage_id=old))
    await service.count([tokens(account, new, 80, T0)])
    crossed = [json.loads(p) for t, _, p in publisher.sent if t is QUOTA_THRESHOLDS]
    assert sorted(c["api_key_id"] for c in crossed) == sorted([str(old), str(new)])
    assert {c["threshold_pct"] for c in crossed} == {80}


async def test_states_of_one_key_carry_increasing_versions_and_republish_includes_them(service, publisher):
    account, key = uuid.uuid4(), uuid.uuid4()
    await service.apply_key(key_state(account, key, [month(1_000)]))
    await service.count([tokens(account, key, 1, T0)])
    await service.republish()
    versions = [s["version"] for s in key_states(publisher, key)]
    assert versions == sorted(versions) and len(set(versions)) == len(versions) == 3


async def test_one_batch_of_a_keys_usage_on_two_resources_publishes_its_standing_on_both(service, publisher):
    account, key = uuid.uuid4(), uuid.uuid4()
    await service.apply_key(key_state(account, key, [month(1_000), month(10, Resource.CONTENT_PUBLISHES)]))
    publishes = UsageEvent(
        time=T0, account_id=account, resource=Resource.CONTENT_PUBLISHES, quantity=3, source="t", api_key_id=key
    )
    await service.count([tokens(account, key, 400, T0), publishes])
    assert last_state(publisher, key, Resource.AI_TOKENS, LimitPeriod.MONTH)["used"] == 400
    assert last_state(publisher, key, Resource.CONTENT_PUBLISHES, LimitPeriod.MONTH)["used"] == 3
