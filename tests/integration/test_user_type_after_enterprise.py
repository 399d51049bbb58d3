"""The version-12 rule across services: an account that has just paid for the enterprise tier
cannot become `individual` (keys judges the user-type change by the plan billing put in force)."""

import asyncio
import uuid

import httpx
import pytest

from tests.integration.test_keys_api import PASSWORD

pytestmark = pytest.mark.integration


@pytest.fixture
def client(module_client: httpx.AsyncClient) -> httpx.AsyncClient:
    return module_client


async def enterprise_signup(client: httpx.AsyncClient) -> dict[str, str]:
    email = f"e{uuid.uuid4().hex[:10]}@example.com"
    body = {"email": email, "password": PASSWORD, "name": "Ent", "user_type": "enterprise"}
    assert (await client.post("/api/auth/register", json=body)).status_code == 201
    login = await client.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    assert login.status_code == 200, login.text
    return {"Authorization": f"Bearer {login.json()['access_token']}"}


async def test_a_user_type_change_right_after_paying_for_enterprise_is_refused(client):
    for _ in range(3):
        console = await enterprise_signup(client)
        order = await client.post("/api/billing/orders", json={"kind": "plan_upgrade", "plan": "enterprise"}, headers=console)
        assert order.status_code == 201, order.text
        paid = await client.post(f"/api/billing/orders/{order.json()['id']}/pay", headers=console)
        assert paid.status_code == 200 and paid.json()["status"] == "paid"
        # The payment answered: the enterprise plan is in force. Becoming individual now must be refused.
        changed = await client.put("/api/account/user-type", json={"user_type": "individual"}, headers=console)
        assert changed.status_code == 409, changed.text
        assert changed.json()["error"]["code"] == "user_type_plan_mismatch"
        sub = (await client.get("/api/billing/subscription", headers=console)).json()
        assert (sub["plan"], sub["user_type"]) == ("enterprise", "enterprise")


async def test_becoming_individual_while_paying_for_enterprise_never_lets_both_through(client):
    """The two writes at the same instant, many times: keys changes the user type under its
    account row, billing puts the plan in force under its own, and each judged by its copy of
    the other's fact (a consumer behind), so both passed and an individual account held the
    enterprise tier. Exactly one of them may pass, and the account never ends individual on
    enterprise."""
    # The user-type change starts up to 12 ms after the payment (which has more to do before its
    # decision), so the race goes each way.
    for i in range(16):
        console = await enterprise_signup(client)
        order = await client.post("/api/billing/orders", json={"kind": "plan_upgrade", "plan": "enterprise"}, headers=console)
        assert order.status_code == 201, order.text

        async def change_user_type(after_s: float) -> httpx.Response:
            await asyncio.sleep(after_s)
            return await client.put("/api/account/user-type", json={"user_type": "individual"}, headers=console)

        paid, changed = await asyncio.gather(
            client.post(f"/api/billing/orders/{order.json()['id']}/pay", headers=console),
            change_user_type(i % 4 * 0.004),
        )
        assert {paid.status_code, changed.status_code} == {200, 409}, (paid.text, changed.text)
        refused = changed if changed.status_code == 409 else paid
        assert refused.json()["error"]["code"] == "user_type_plan_mismatch"
        user_type = (await client.get("/api/account", headers=console)).json()["user_type"]
        plan = (await client.get("/api/billing/subscription", headers=console)).json()["plan"]
        assert (plan, user_type) in {("enterprise", "enterprise"), ("free", "individual")}
