"""(v2) A blocked customer can always see why: the two quota reads are neither counted as
api_calls nor refused when api_calls is exhausted, yet authenticated, rate-limited and in the
activity log; every other API-key route answers 403 insufficient_quota with its details."""

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from contracts.common import Resource
from contracts.events import UsageEvent
from contracts.topics import USAGE
from tests.integration.quota_helpers import bearer, eventually, new_account, new_api_key, publish

pytestmark = pytest.mark.integration
READS = ("/api/billing/check-quota", "/api/ai/usage/quota")


def item(report: dict, resource: Resource) -> dict:
    return next(i for i in report["items"] if i["resource"] == resource.value)


def next_month_start() -> str:
    now = datetime.now(UTC)
    return (now.replace(day=1) + timedelta(days=32)).replace(day=1).strftime("%Y-%m-01T00:00:00Z")


async def test_quota_reads_are_not_counted_and_stay_open_when_api_calls_are_exhausted(app_client, settings):
    app, client = app_client
    account_id, session = await new_account(app, settings)
    key = bearer(await new_api_key(app, settings, account_id))

    async def calls_used(expected: int) -> dict:
        async def probe():
            report = (await client.get("/api/billing/check-quota", headers=bearer(session))).json()
            return report if item(report, Resource.API_CALLS)["used"] == expected else None

        return await eventually(probe)

    # Quota reads with the key, then one counted call: its count arrives after theirs (one account,
    # one partition), so once it is in, the reads were seen and not counted.
    for path in READS * 3:
        read = await client.get(path, headers=key)
        assert read.status_code == 200 and "X-RateLimit-Limit" in read.headers  # still rate-limited
    assert (await client.get("/api/geo/projects", headers=key)).status_code == 200
    await calls_used(1)
    assert edge_pending(app, account_id) == 0

    # Exhaust api_calls (1000 on free).
    await publish(
        settings,
        USAGE.name,
        [UsageEvent(time=datetime.now(UTC), account_id=account_id, resource=Resource.API_CALLS, quantity=999, source="test")],
        key=lambda e: str(e.account_id),
    )
    await calls_used(1000)

    async def refused():
        response = await client.get("/api/geo/projects", headers=key)
        return response if response.status_code == 403 else None

    denied = (await eventually(refused)).json()["error"]
    assert denied["code"] == "insufficient_quota" and denied["request_id"]
    base = settings.console_url.rstrip("/")
    assert denied["details"] == {
        "resource": "api_calls",
        "used": 1000,
        "total": 1000,
        "period_end": next_month_start(),
        "links": {"upgrade_plan": f"{base}/plan", "buy_quota_package": f"{base}/quota?buy=api_calls"},
        "scope": "account",  # (v4) the account's quota, not one key's own limit
    }

    # Both reads still answer with the key, many times, and show why; nothing moves `used`.
    answers = await asyncio.gather(*[client.get(path, headers=key) for path in READS * 5])
    assert {a.status_code for a in answers} == {200}
    calls = item(answers[0].json(), Resource.API_CALLS)
    assert (calls["used"], calls["status"]) == (1000, "exhausted")
    other = await client.post(
        "/api/ai/usage/alert",
        json={"metric": "api_calls", "threshold_pct": 50, "channels": ["in_site"], "recipients": []},
        headers=key,
    )
    assert (other.status_code, other.json()["error"]["code"]) == (403, "insufficient_quota")

    # The reads are in the activity log (calls.v1 carries them), 16 of them, all 200.
    async def logged():
        items = (await client.get("/api/activity-log", params={"limit": 200}, headers=bearer(session))).json()["items"]
        reads = [i for i in items if i["path"] in READS]
        return reads if len(reads) == 16 else None

    assert {i["status"] for i in await eventually(logged)} == {200}
    # One more counted-looking event would have arrived by now; `used` is where it was.
    await asyncio.sleep(1.0)
    await calls_used(1000)


def edge_pending(app, account_id) -> int:
    return app.state.runtime.edge.quota.pending_calls(account_id)
