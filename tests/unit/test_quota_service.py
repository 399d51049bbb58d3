"""Every use case of services/quota/service.py on fakes: counting, crossings, blocks, billing
facts, period rollover, reservations. No I/O (tests/unit/fakes.py)."""

import json
import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from contracts.common import Resource, Tier
from contracts.domain_errors import Forbidden
from contracts.errors import ErrorCode
from contracts.events import CallEvent, PackagePurchased, PlanChanged, UsageEvent
from contracts.rate_limit import RateLimit
from contracts.topics import QUOTA, QUOTA_THRESHOLDS
from services.quota.domain import InsufficientQuota
from services.quota.service import QuotaService
from tests.unit.fakes import FakeClock, FakePublisher, FakeQuotaStore

TOKENS = 100_000  # the free tier's ai_tokens
CALLS = 1_000  # and api_calls
CONSOLE = "https://console.test"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2026, 11, 15, 12, 0, tzinfo=UTC))


@pytest.fixture
def publisher() -> FakePublisher:
    return FakePublisher()


@pytest.fixture
def service(clock: FakeClock, publisher: FakePublisher) -> QuotaService:
    return QuotaService(FakeQuotaStore(), publisher, clock, ZoneInfo("UTC"), CONSOLE)  # type: ignore[arg-type]


def tokens(account: uuid.UUID, quantity: int, when: datetime, **kw: object) -> UsageEvent:
    return UsageEvent(time=when, account_id=account, resource=Resource.AI_TOKENS, quantity=quantity, source="test", **kw)


def call(account: uuid.UUID, when: datetime, status: int = 200, path: str = "/api/geo/projects") -> CallEvent:
    return CallEvent(
        time=when, account_id=account, api_key_id=uuid.uuid4(), method="GET", path=path, status=status, ip="1.2.3.4", latency_ms=1
    )


def states(publisher: FakePublisher, resource: Resource) -> list[dict]:
    return [json.loads(p) for t, k, p in publisher.sent if t is QUOTA and k.endswith(resource.value)]


def crossings(publisher: FakePublisher) -> list[int]:
    return [json.loads(p)["threshold_pct"] for t, _k, p in publisher.sent if t is QUOTA_THRESHOLDS]


async def used(service: QuotaService, account: uuid.UUID, resource: Resource) -> int:
    return next(i.used for i in (await service.report(account)).items if i.resource is resource)


async def test_usage_and_admitted_calls_count_once_per_event_id(service, clock, publisher):
    account = uuid.uuid4()
    first = tokens(account, 1_000, clock())
    await service.count([first, first, call(account, clock()), call(account, clock(), status=403)])
    assert await used(service, account, Resource.AI_TOKENS) == 1_000  # a batch may hold one event twice
    assert await used(service, account, Resource.API_CALLS) == 1  # the refused call used nothing
    await service.count([first])  # redelivered: nothing more counted...
    assert await used(service, account, Resource.AI_TOKENS) == 1_000
    last = states(publisher, Resource.AI_TOKENS)[-1]  # ...but the state is published again
    assert (last["used"], last["total"], last["period"], last["blocked"]) == (1_000, TOKENS, "2026-11", False)
    # the quota reads themselves do not count
    await service.count([call(account, clock(), path="/api/billing/check-quota")])
    assert await used(service, account, Resource.API_CALLS) == 1


async def test_a_crossing_is_announced_once_per_whole_percent_with_the_highest_crossed(service, clock, publisher):
    account = uuid.uuid4()
    await service.count([tokens(account, 50_000, clock())])
    await service.count([tokens(account, 45_500, clock())])  # 50% -> 95.5%: one crossing, 95
    await service.count([tokens(account, 400, clock())])  # 95.9%: still 95, nothing new
    await service.count([tokens(account, 100, clock())])  # 96%
    assert crossings(publisher) == [50, 95, 96]
    ids = [json.loads(p)["id"] for t, _k, p in publisher.sent if t is QUOTA_THRESHOLDS]
    assert len(set(ids)) == 3


async def test_the_total_blocks_and_a_plan_change_or_a_package_raises_it(service, clock, publisher):
    account = uuid.uuid4()
    await service.count([call(account, clock()) for _ in range(CALLS)])
    assert states(publisher, Resource.API_CALLS)[-1]["blocked"] is True
    report = await service.report(account)
    calls = next(i for i in report.items if i.resource is Resource.API_CALLS)
    assert (calls.status, calls.band, calls.remaining) == ("exhausted", "red", 0)

    plan = PlanChanged(
        time=clock(),
        account_id=account,
        plan=Tier.BASIC,
        quotas={Resource.API_CALLS: 50_000, Resource.AI_TOKENS: 1_000_000},
        rate_limit=RateLimit(per_second=10, burst=20, per_minute=600),
    )
    await service.apply_plan(plan)
    last = states(publisher, Resource.API_CALLS)[-1]
    assert (last["total"], last["blocked"]) == (50_000, False)
    older = plan.model_copy(update={"id": uuid.uuid4(), "time": clock() - timedelta(days=1), "quotas": {}})
    await service.apply_plan(older)  # a reordered, older plan change does not win
    assert states(publisher, Resource.API_CALLS)[-1]["total"] == 50_000

    package = PackagePurchased(
        time=clock(), account_id=account, resource=Resource.AI_TOKENS, amount=200_000, period="2026-11", order_id=uuid.uuid4()
    )
    await service.apply_package(package)
    await service.apply_package(package.model_copy(update={"id": uuid.uuid4()}))  # the same order twice
    assert states(publisher, Resource.AI_TOKENS)[-1]["total"] == 1_200_000
    assert crossings(publisher) == [100]  # raising a total announces nothing by itself


async def test_a_new_period_on_the_clock_resets_flows_keeps_stocks_and_lapses_packages(service, clock):
    account = uuid.uuid4()
    geo = UsageEvent(time=clock(), account_id=account, resource=Resource.GEO_PROJECTS, quantity=2, source="test")
    await service.count([tokens(account, 90_000, clock()), geo])
    await service.apply_package(
        PackagePurchased(
            time=clock(), account_id=account, resource=Resource.AI_TOKENS, amount=1, period="2026-11", order_id=uuid.uuid4()
        )
    )
    clock.now = datetime(2026, 12, 1, 0, 0, tzinfo=UTC)
    report = await service.report(account)
    assert report.period.start == datetime(2026, 12, 1, tzinfo=UTC) and report.period.end == datetime(2027, 1, 1, tzinfo=UTC)
    ai = next(i for i in report.items if i.resource is Resource.AI_TOKENS)
    assert (ai.used, ai.total) == (0, TOKENS)
    assert await used(service, account, Resource.GEO_PROJECTS) == 2
    # An event is counted in the period of its own time, even when it arrives late.
    await service.count([tokens(account, 5, datetime(2026, 11, 30, 23, 59, tzinfo=UTC))])
    assert await used(service, account, Resource.AI_TOKENS) == 0


def announced(publisher: FakePublisher) -> list[tuple[str, int]]:
    return [(c["period"], c["threshold_pct"]) for t, _k, p in publisher.sent if t is QUOTA_THRESHOLDS for c in [json.loads(p)]]


async def test_a_late_event_of_last_month_announces_its_crossing_for_last_month(service, clock, publisher):
    account = uuid.uuid4()
    clock.now = datetime(2027, 1, 31, 12, 0, tzinfo=UTC)
    await service.count([tokens(account, 49_000, clock())])
    # Counted one consumer lag after midnight: January's counter moves, and so does its crossing.
    clock.now = datetime(2027, 2, 1, 0, 0, 1, tzinfo=UTC)
    await service.count([tokens(account, 2_000, datetime(2027, 1, 31, 23, 59, 58, tzinfo=UTC))])
    assert announced(publisher) == [("2027-01", 49), ("2027-01", 51)]
    # The state published is February's, the period the edge gates now: January's would replace it.
    last = states(publisher, Resource.AI_TOKENS)[-1]
    assert (last["period"], last["used"]) == ("2027-02", 0)
    await service.count([tokens(account, 2_000, datetime(2027, 1, 31, 23, 59, 58, tzinfo=UTC))])  # another 2%
    await service.count([tokens(account, 1_000, clock())])  # February's own 1%
    assert announced(publisher)[2:] == [("2027-01", 53), ("2027-02", 1)]


async def test_a_late_call_announces_its_crossing_for_last_month_once(service, clock, publisher):
    account = uuid.uuid4()
    clock.now = datetime(2027, 2, 1, 0, 0, 1, tzinfo=UTC)
    late = [call(account, datetime(2027, 1, 31, 23, 59, 58, tzinfo=UTC)) for _ in range(CALLS)]
    await service.count(late)
    await service.count(late)  # redelivered: nothing counted, nothing new crossed
    assert announced(publisher) == [("2027-01", 100)]


async def test_an_event_a_few_seconds_ahead_of_the_clock_announces_its_crossing_in_the_next_period(service, clock, publisher):
    account = uuid.uuid4()
    clock.now = datetime(2027, 1, 31, 23, 59, 59, tzinfo=UTC)
    await service.count([tokens(account, 10_000, datetime(2027, 2, 1, 0, 0, 2, tzinfo=UTC))])
    assert announced(publisher) == [("2027-02", 10)]
    assert states(publisher, Resource.AI_TOKENS)[-1]["period"] == "2027-01"  # the period still gated


async def test_history_counted_into_a_period_long_over_is_not_announced(service, clock, publisher):
    account = uuid.uuid4()  # a backfill of 2025 (its records stamped with their own times)
    await service.count([tokens(account, 90_000, datetime(2025, 3, 10, tzinfo=UTC))])
    assert announced(publisher) == []
    # A period that ended less than 35 days ago still takes late usage: announced.
    await service.count([tokens(account, 90_000, datetime(2026, 10, 31, 23, 0, tzinfo=UTC))])
    assert announced(publisher) == [("2026-10", 90)]


async def test_reservations_reserve_refuse_settle_release_and_expire(service, clock, publisher):
    account, owner = uuid.uuid4(), uuid.uuid4()
    held = await service.reserve(account, Resource.AI_TOKENS, 60_000, ttl_seconds=600, owner_id=owner)
    assert held.expires_at == clock() + timedelta(seconds=600)
    assert states(publisher, Resource.AI_TOKENS)[-1]["reserved"] == 60_000

    with pytest.raises(InsufficientQuota) as refused:
        await service.reserve(account, Resource.AI_TOKENS, 40_001, ttl_seconds=600)
    error = refused.value
    assert isinstance(error, Forbidden) and error.code is ErrorCode.INSUFFICIENT_QUOTA
    assert (error.used, error.reserved, error.total) == (0, 60_000, TOKENS)
    assert error.details["reserved"] == 60_000 and error.details["period_end"].startswith("2026-12-01T00:00:00")
    assert error.details["links"]["buy_quota_package"] == f"{CONSOLE}/quota?buy=ai_tokens"

    # A usage event naming the reservation counts the actual amount and frees the hold, once.
    settle = tokens(account, 30_000, clock(), reservation_id=held.id)
    await service.count([settle])
    await service.count([settle])
    last = states(publisher, Resource.AI_TOKENS)[-1]
    assert (last["used"], last["reserved"]) == (30_000, 0)

    second = await service.reserve(account, Resource.AI_TOKENS, 70_000, ttl_seconds=60, owner_id=owner)
    assert states(publisher, Resource.AI_TOKENS)[-1]["blocked"] is True
    assert not await service.release(second.id, owner_id=uuid.uuid4())  # another owner's: not found
    assert await service.release(second.id, owner_id=owner)
    assert not await service.release(second.id, owner_id=owner)

    await service.reserve(account, Resource.AI_TOKENS, 70_000, ttl_seconds=60)
    assert await service.expire() == 0  # not yet due
    clock.advance(seconds=61)
    await service.expire_all()
    last = states(publisher, Resource.AI_TOKENS)[-1]
    assert (last["reserved"], last["blocked"]) == (0, False)
    assert await service.expire() == 0


async def test_an_expired_reservation_is_not_released_even_before_the_sweep(service, clock, publisher):
    """It stopped holding anything at its expiry: DELETE answers 404 (as the route says), not a 204
    that tells the service it released a hold, and publishes nothing."""
    owner = uuid.uuid4()
    held = await service.reserve(uuid.uuid4(), Resource.AI_TOKENS, 1_000, ttl_seconds=60, owner_id=owner)
    published = len(publisher.sent)
    clock.advance(seconds=60)
    assert not await service.release(held.id, owner_id=owner)
    assert len(publisher.sent) == published


async def test_the_sweepers_idle_pass_is_one_read_and_no_transaction(clock, publisher):
    store = FakeQuotaStore()
    service = QuotaService(store, publisher, clock, ZoneInfo("UTC"), CONSOLE)  # type: ignore[arg-type]
    account = uuid.uuid4()
    await service.reserve(account, Resource.AI_TOKENS, 1_000, ttl_seconds=60)
    before = store.transactions
    await service.expire_all()
    assert (store.expiry_checks, store.transactions) == (1, before)  # nothing due: no transaction
    clock.advance(seconds=60)
    await service.expire_all()
    assert store.transactions > before and states(publisher, Resource.AI_TOKENS)[-1]["reserved"] == 0


async def test_reads_and_reservations_judge_by_billing_v1_totals_before_quota_has_applied_them(
    clock: FakeClock, publisher: FakePublisher
) -> None:
    """A payment answers once billing.v1 has it; quota's own billing.v1 consumer may apply it a
    moment later. The quota reads and reservations take billing.v1's totals (the edge's) where
    known, so a package or upgrade just paid is in them, and a downgrade too; the free plan's
    otherwise."""
    account, other = uuid.uuid4(), uuid.uuid4()
    known = {(account, Resource.AI_TOKENS, "2026-11"): TOKENS + 500_000}
    service = QuotaService(
        FakeQuotaStore(),  # type: ignore[arg-type]
        publisher,  # type: ignore[arg-type]
        clock,
        ZoneInfo("UTC"),
        CONSOLE,
        totals=lambda a, r, p: known.get((a, r, p)),
    )
    report = {i.resource: i for i in (await service.report(account)).items}
    assert report[Resource.AI_TOKENS].total == TOKENS + 500_000 and report[Resource.AI_TOKENS].remaining == TOKENS + 500_000
    assert report[Resource.API_CALLS].total == CALLS  # nothing known of it: quota's own (the free plan's)
    await service.reserve(account, Resource.AI_TOKENS, TOKENS + 1, ttl_seconds=60)
    with pytest.raises(InsufficientQuota):
        await service.reserve(other, Resource.AI_TOKENS, TOKENS + 1, ttl_seconds=60)
