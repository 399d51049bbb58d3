"""The quota reads' one rule (not counted, not gated) and what a 403 insufficient_quota says."""

import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from contracts.common import Resource
from contracts.events import CallEvent, QuotaState
from contracts.quota_api import UNCOUNTED_CALLS, counts_as_api_call, quota_links
from services.alerts import domain as alerts
from services.edge.edge import insufficient_quota
from services.edge.quota_gate import QuotaProjection
from services.quota import domain as quota

T0 = datetime(2026, 3, 10, tzinfo=UTC)


def _call(path: str, status: int = 200, method: str = "GET") -> CallEvent:
    return CallEvent(
        time=T0, account_id=uuid.uuid4(), api_key_id=uuid.uuid4(), method=method, path=path, status=status, ip="", latency_ms=1
    )


def test_the_quota_reads_are_the_only_uncounted_calls_and_the_quota_service_follows_the_same_rule():
    assert UNCOUNTED_CALLS == {("GET", "/api/billing/check-quota"), ("GET", "/api/ai/usage/quota")}
    for method, path in UNCOUNTED_CALLS:
        assert not counts_as_api_call(method, path)
        assert not quota.call_counts(_call(path, method=method))
    assert counts_as_api_call("GET", "/api/geo/projects") and quota.call_counts(_call("/api/geo/projects"))
    assert counts_as_api_call("POST", "/api/billing/check-quota")  # only the reads, by method and template
    assert not quota.call_counts(_call("/api/geo/projects", 403))  # refused: as before
    events = [_call("/api/billing/check-quota"), _call("/api/ai/usage/quota"), _call("/api/geo/projects")]
    assert [d.quantity for d in quota.deltas(events, ZoneInfo("UTC"))] == [1]


def _state(account, resource, used, total, period="2026-03"):
    return QuotaState(
        time=T0, account_id=account, resource=resource, period=period, total=total, used=used, blocked=used >= total
    )


def test_standing_knows_free_totals_pending_calls_and_that_stocks_carry_over():
    gate, a = QuotaProjection(ZoneInfo("UTC")), uuid.uuid4()
    assert gate.standing(a, Resource.GEO_PROJECTS, T0) == (0, 3)  # no state: the free plan
    assert gate.standing(a, Resource.API_CALLS, T0) == (0, 1000)
    gate.apply(_state(a, Resource.API_CALLS, 998, 1000))
    assert gate.admit_call(a, T0 + timedelta(seconds=1)) and gate.admit_call(a, T0 + timedelta(seconds=1))
    assert gate.standing(a, Resource.API_CALLS, T0 + timedelta(seconds=2)) == (1000, 1000)  # + admitted here
    gate.apply(_state(a, Resource.GEO_PROJECTS, 10, 10))
    april = datetime(2026, 4, 2, tzinfo=UTC)
    assert gate.standing(a, Resource.GEO_PROJECTS, april) == (10, 10)  # a stock's level carries over
    assert gate.standing(a, Resource.API_CALLS, april) == (0, 1000)  # a flow starts again


def test_period_end_is_the_next_month_in_the_platform_zone():
    berlin = ZoneInfo("Europe/Berlin")
    assert QuotaProjection(berlin).period_end(T0) == datetime(2026, 4, 1, tzinfo=berlin)
    assert QuotaProjection(berlin).period_end(T0).isoformat() == "2026-04-01T00:00:00+02:00"
    assert QuotaProjection(ZoneInfo("UTC")).period_end(datetime(2026, 12, 31, 23, tzinfo=UTC)) == datetime(2027, 1, 1, tzinfo=UTC)


def test_insufficient_quota_carries_the_details_and_the_links_alerts_use():
    error = insufficient_quota("https://console.example/", Resource.AI_TOKENS, 120, 100, datetime(2026, 4, 1, tzinfo=UTC))
    assert (error.status, error.code.value) == (403, "insufficient_quota")
    assert error.details == {
        "resource": "ai_tokens",
        "used": 120,
        "total": 100,
        "period_end": "2026-04-01T00:00:00Z",
        "scope": "account",  # (v4) not a key's own limit
        "links": {
            "upgrade_plan": "https://console.example/plan",
            "buy_quota_package": "https://console.example/quota?buy=ai_tokens",
        },
    }
    same = alerts.links_for("https://console.example/", Resource.AI_TOKENS)
    assert quota_links("https://console.example/", Resource.AI_TOKENS).model_dump() == {
        "upgrade_plan": same.upgrade_plan,
        "buy_quota_package": same.buy_quota_package,
    }
