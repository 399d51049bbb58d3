"""Packages as large as an order may be, bought twice in a month: their sum is past a bigint. The
quota service must still apply them and answer (a failing billing.v1 event would be redelivered
for ever and hold up every account's plans and packages behind it)."""

import pytest

from contracts.common import Resource
from tests.integration.quota_helpers import bearer, eventually, new_account
from tests.support.apps import running_app

pytestmark = pytest.mark.integration

GIB = 2**30
LARGEST = 2**63 - GIB  # the largest whole number of GiB units an order may hold (billing.domain)


def total_of(report: dict, resource: Resource) -> int:
    return int(next(i for i in report["items"] if i["resource"] == resource.value)["total"])


async def _buy(client, session: str, resource: str, amount: int) -> None:
    order = await client.post(
        "/api/billing/orders",
        json={"kind": "quota_package", "package": {"resource": resource, "amount": amount}},
        headers=bearer(session),
    )
    assert order.status_code == 201, order.text
    paid = await client.post(f"/api/billing/orders/{order.json()['id']}/pay", headers=bearer(session))
    assert paid.status_code == 200, paid.text


async def test_two_largest_packages_in_a_month_neither_break_the_quota_reads_nor_jam_quotas_consumer(settings):
    async with running_app(settings) as (app, client):
        _big, big_session = await new_account(app, settings)
        await _buy(client, big_session, "storage_bytes", LARGEST)
        await _buy(client, big_session, "storage_bytes", LARGEST)

        # Another account's package after them is applied by quota (its consumer went on).
        _other, other_session = await new_account(app, settings)
        await _buy(client, other_session, "ai_tokens", 200_000)

        async def others_tokens() -> int | None:
            answer = await client.get("/api/billing/check-quota", headers=bearer(other_session))
            total = total_of(answer.json(), Resource.AI_TOKENS) if answer.status_code == 200 else 0
            return total if total > 100_000 else None  # the free plan's 100,000 and the package

        assert await eventually(others_tokens, within=30) == 300_000
        report = await client.get("/api/billing/check-quota", headers=bearer(big_session))
        assert report.status_code == 200, report.text
        assert total_of(report.json(), Resource.STORAGE_BYTES) >= 2**62  # past any use: unlimited in effect
