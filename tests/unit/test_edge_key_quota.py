"""(v4) The edge's gate on a key's own limits (services/edge/key_quota.py): windows, removal,
cost, and this process's own api_calls admissions against a key's limit."""

import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from contracts.common import Resource
from contracts.events import KeyQuotaState
from contracts.key_limits import KeyLimit, LimitPeriod
from services.edge.key_quota import KeyQuotaProjection

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
DAY_TOKENS = KeyLimit(resource=Resource.AI_TOKENS, amount=100, period=LimitPeriod.DAY)
CALLS = KeyLimit(resource=Resource.API_CALLS, amount=3, period=LimitPeriod.ONCE)


def state(key: uuid.UUID, limit: KeyLimit, window: str, used: int, version: int = 1, **kw: object) -> KeyQuotaState:
    return KeyQuotaState(
        time=T0,
        account_id=uuid.uuid4(),
        api_key_id=key,
        resource=limit.resource,
        period=limit.period,
        window=window,
        amount=limit.amount,
        used=used,
        blocked=used >= limit.amount,
        version=version,
        **kw,  # type: ignore[arg-type]
    )


def test_a_limit_refuses_when_exhausted_or_when_the_cost_does_not_fit_and_a_new_day_starts_from_zero():
    gate, key = KeyQuotaProjection(ZoneInfo("UTC")), uuid.uuid4()
    gate.apply(state(key, DAY_TOKENS, "2026-11-26", 90))
    assert gate.refusing(key, [DAY_TOKENS], Resource.AI_TOKENS, 10, T0) is None
    refused = gate.refusing(key, [DAY_TOKENS], Resource.AI_TOKENS, 11, T0)
    assert refused is not None and (refused.used, refused.remaining) == (90, 10)
    assert refused.resets_at == datetime(2026, 11, 27, tzinfo=ZoneInfo("UTC"))
    assert gate.refusing(key, [DAY_TOKENS], Resource.AI_TOKENS, 100, T0 + timedelta(days=1)) is None
    assert gate.refusing(key, [DAY_TOKENS], Resource.API_CALLS, 1_000, T0) is None  # another resource


def test_an_older_state_changes_nothing_and_a_removed_limit_is_forgotten():
    gate, key = KeyQuotaProjection(ZoneInfo("UTC")), uuid.uuid4()
    gate.apply(state(key, DAY_TOKENS, "2026-11-26", 100, version=2))
    gate.apply(state(key, DAY_TOKENS, "2026-11-26", 0, version=1))
    assert gate.refusing(key, [DAY_TOKENS], Resource.AI_TOKENS, 0, T0) is not None
    gate.apply(state(key, DAY_TOKENS, "2026-11-26", 0, version=3, removed=True))
    assert gate.get(key, Resource.AI_TOKENS, LimitPeriod.DAY) is None


def test_this_process_admits_exactly_a_keys_api_calls_limit_and_takes_back_a_refused_call():
    gate, key = KeyQuotaProjection(ZoneInfo("UTC")), uuid.uuid4()
    assert [gate.admit_call(key, [CALLS], T0) is None for _ in range(4)] == [True, True, True, False]
    gate.give_back(key, [CALLS], T0)
    assert gate.admit_call(key, [CALLS], T0) is None and gate.admit_call(key, [CALLS], T0) is not None
    # quota's state covers the admissions up to its watermark: still 3 used, never more
    gate.apply(state(key, CALLS, "once", 3))
    assert gate.standing(key, CALLS, T0).used == 3


def test_a_keys_usage_shows_what_was_counted_what_is_left_after_reservations_and_when_it_resets():
    gate, key = KeyQuotaProjection(ZoneInfo("UTC")), uuid.uuid4()
    gate.apply(state(key, DAY_TOKENS, "2026-11-26", 60, reserved=30))
    usage = gate.standing(key, DAY_TOKENS, T0).usage()
    assert (usage.resource, usage.period, usage.used, usage.amount, usage.remaining) == ("ai_tokens", "day", 60, 100, 10)
    assert usage.resets_at == datetime(2026, 11, 27, tzinfo=ZoneInfo("UTC"))
    # the next day: nothing used in it yet, the open reservation still held
    tomorrow = gate.standing(key, DAY_TOKENS, T0 + timedelta(days=1)).usage()
    assert (tomorrow.used, tomorrow.remaining) == (0, 70)
    # a limit quota has not counted against yet, and `once` credits, which never reset
    fresh = gate.standing(key, CALLS, T0).usage()
    assert (fresh.used, fresh.remaining, fresh.resets_at) == (0, 3, None)
