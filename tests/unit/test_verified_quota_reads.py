"""The quota reads' exemption (API.md, "Quota") is Tollgate's own two routes: a blocked customer can
always see why. A call a platform service verifies (verify, authorize) is that service's call, on
its own route, whatever its path is named: admitted, it counts in api_calls, and it is refused when
they are exhausted. Otherwise a caller behind an ingress could name `GET /api/ai/usage/quota` as
its request and be served by the protected upstream unmetered and ungated."""

import uuid
from datetime import UTC, datetime
from typing import Any

from contracts.common import Resource, Role
from contracts.credentials import hash_secret
from contracts.events import CallEvent, KeyState, QuotaState
from contracts.period import period_of
from contracts.quota_api import counts_as_api_call
from services.edge.edge import Edge
from services.edge.verdict import ServiceCall
from services.quota.domain import call_counts
from tests.unit.test_edge_key_rules import app  # noqa: F401 - the fixture

KEY = "sk-" + "q" * 43
QUOTA_READ = "/api/ai/usage/quota"


def test_only_tollgates_own_quota_reads_are_free():
    assert not counts_as_api_call("GET", QUOTA_READ)
    assert counts_as_api_call("GET", QUOTA_READ, service="ai-gateway")
    assert counts_as_api_call("GET", "/api/billing/check-quota", service="ai-gateway")


def _call(path: str, service: str | None) -> CallEvent:
    return CallEvent(
        time=datetime.now(UTC), account_id=uuid.uuid4(), api_key_id=uuid.uuid4(), method="GET", path=path,
        status=200, ip="203.0.113.7", latency_ms=1.0, service=service,
    )  # fmt: skip


def test_quota_counts_a_verified_call_on_a_path_named_like_a_quota_read():
    assert not call_counts(_call(QUOTA_READ, None))
    assert call_counts(_call(QUOTA_READ, "ai-gateway"))


async def test_verify_refuses_a_call_named_like_a_quota_read_once_api_calls_are_exhausted(app: Any) -> None:  # noqa: F811
    edge: Edge = app.state.runtime.edge
    account = uuid.uuid4()
    edge.keys.apply(
        KeyState(
            time=datetime.now(UTC), account_id=account, key_id=uuid.uuid4(), hash=hash_secret(KEY),
            status="enabled", roles=[Role.OWNER],
        )
    )  # fmt: skip
    now = datetime.now(UTC)
    edge.quota.apply(
        QuotaState(
            time=now, account_id=account, resource=Resource.API_CALLS, period=period_of(now, edge.settings.tz),
            total=5, used=5, blocked=True,
        )
    )  # fmt: skip
    verdict = await edge.decide(ServiceCall(KEY, "GET", QUOTA_READ, "203.0.113.7", "t/1", "ai-gateway"), "r-1")
    assert verdict.refusal is not None and verdict.refusal.code.value == "insufficient_quota"
