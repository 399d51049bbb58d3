"""A payment's effect is immediate (API.md, "Billing and plans": upgrade, new quotas now; package,
the amount added to this period): the quota reads answered right after the payment's 200 show the
new totals, as the edge's gate already judges by them."""

import pytest

from contracts.common import Resource
from tests.integration.quota_helpers import bearer, new_account

pytestmark = pytest.mark.integration


def _total(report: dict, resource: Resource) -> int:
    return int(next(i for i in report["items"] if i["resource"] == resource.value)["total"])


async def test_the_quota_reads_show_a_paid_package_and_upgrade_at_once(app_client, settings):
    app, client = app_client
    _, session = await new_account(app, settings)
    console = bearer(session)
    before = (await client.get("/api/billing/check-quota", headers=console)).json()
    geo = _total(before, Resource.GEO_PROJECTS)

    order = await client.post(
        "/api/billing/orders",
        json={"kind": "quota_package", "package": {"resource": "geo_projects", "amount": 2}},
        headers=console,
    )
    assert order.status_code == 201, order.text
    paid = await client.post(f"/api/billing/orders/{order.json()['id']}/pay", headers=console)
    assert paid.status_code == 200, paid.text
    for path in ("/api/billing/check-quota", "/api/ai/usage/quota"):
        report = (await client.get(path, headers=console)).json()
        assert _total(report, Resource.GEO_PROJECTS) == geo + 2, (path, report)

    order = await client.post("/api/billing/orders", json={"kind": "plan_upgrade", "plan": "professional"}, headers=console)
    paid = await client.post(f"/api/billing/orders/{order.json()['id']}/pay", headers=console)
    assert paid.status_code == 200, paid.text
    report = (await client.get("/api/billing/check-quota", headers=console)).json()
    assert _total(report, Resource.API_CALLS) == 500_000, report
