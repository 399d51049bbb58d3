"""Reservations' pure rules: what fits, what blocks, and the edge's gate counting `reserved`."""

import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from contracts.common import Resource
from contracts.events import QuotaState
from services.edge.quota_gate import CallsView, QuotaProjection
from services.quota import domain

T0 = datetime(2026, 3, 10, tzinfo=UTC)


def state(account: uuid.UUID, resource: Resource, used: int, reserved: int, total: int, period: str = "2026-03") -> QuotaState:
    return QuotaState(
        time=T0,
        account_id=account,
        resource=resource,
        period=period,
        total=total,
        used=used,
        reserved=reserved,
        blocked=domain.is_blocked(used, reserved, total),
    )


def test_a_reservation_fits_up_to_the_total_exactly():
    assert domain.fits(used=60, reserved=30, amount=10, total=100)
    assert not domain.fits(used=60, reserved=30, amount=11, total=100)
    assert domain.is_blocked(60, 40, 100) and not domain.is_blocked(60, 39, 100)


def test_the_gate_counts_reserved_api_calls_as_used():
    gate, a = QuotaProjection(ZoneInfo("UTC")), uuid.uuid4()
    gate.apply(state(a, Resource.API_CALLS, used=5, reserved=3, total=10))
    assert [gate.admit_call(a, T0 + timedelta(seconds=i)) for i in range(1, 4)] == [True, True, False]
    assert gate.calls_view(a, T0) == CallsView(a, "2026-03", T0, 5, 3, 10)


def test_the_gate_blocks_any_resource_its_reservations_fill():
    gate, a = QuotaProjection(ZoneInfo("UTC")), uuid.uuid4()
    gate.apply(state(a, Resource.AI_TOKENS, used=70_000, reserved=29_999, total=100_000))
    assert not gate.is_blocked(a, Resource.AI_TOKENS, T0)
    gate.apply(state(a, Resource.AI_TOKENS, used=70_000, reserved=30_000, total=100_000))
    assert gate.is_blocked(a, Resource.AI_TOKENS, T0)


def test_a_new_period_starts_the_flow_again_but_open_reservations_still_hold():
    gate, a = QuotaProjection(ZoneInfo("UTC")), uuid.uuid4()
    gate.apply(state(a, Resource.API_CALLS, used=10, reserved=2, total=10))
    april = datetime(2026, 4, 1, tzinfo=UTC)
    assert gate.calls_view(a, april) == CallsView(a, "2026-04", None, 0, 2, 10)
    assert sum(gate.admit_call(a, april) for _ in range(10)) == 8
