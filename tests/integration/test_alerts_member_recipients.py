"""(v2) A rule's `{user_id}` recipient is any live user of the account, on the whole platform (keys
publishes users.v1, alerts learns the members from it): a member's id is accepted, and a crossing
posts once to the account's inbox, which owner and member both read. An unknown id, another
account's member and a removed member are 422 alike, naming the field."""

import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from contracts.common import Resource
from contracts.events import QuotaThresholdCrossed
from contracts.topics import QUOTA_THRESHOLDS
from services.runtime.platform.settings import Settings
from tests.integration.quota_helpers import publish
from tests.integration.test_alerts_helpers import all_settled, delivery_statuses, eventually, firing_count, this_period
from tests.integration.test_keys_api import signup
from tests.integration.test_members import add, login

pytestmark = pytest.mark.integration

NOT_A_USER = [{"field": "recipients.0.user_id", "message": "The user is not a user of this account.", "type": "value_error"}]


@pytest.fixture
def settings(module_settings: Settings) -> Settings:
    return module_settings


@pytest.fixture
def client(module_client: httpx.AsyncClient) -> httpx.AsyncClient:
    return module_client


def in_site_rule(*user_ids: str) -> dict[str, Any]:
    return {
        "metric": "total_tokens",
        "threshold_pct": 80,
        "channels": ["in_site"],
        "recipients": [{"user_id": u} for u in user_ids],
    }


async def create_once_known(client: httpx.AsyncClient, console: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    """The rule, once alerts has the members from users.v1 (a 422 until then, within about a second)."""
    created: list[httpx.Response] = []

    async def accepted() -> bool:
        created[:] = [await client.post("/api/ai/usage/alert", json=body, headers=console)]
        assert created[0].status_code in (201, 422), created[0].text
        return created[0].status_code == 201

    await eventually(accepted)
    return dict(created[0].json())


async def test_a_members_user_id_is_a_recipient_and_the_account_inbox_gets_the_alert_once(client, settings):
    account, owner = await signup(client)
    member = await add(client, owner, "developer")
    developer = await login(client, member["email"])

    # the developer (alerts:write) names the owner and itself: both users of the account
    rule = await create_once_known(client, developer, in_site_rule(account["id"], member["id"]))
    assert [r["user_id"] for r in rule["recipients"]] == [account["id"], member["id"]]

    crossing = QuotaThresholdCrossed(
        time=datetime.now(UTC),
        account_id=uuid.UUID(account["id"]),
        resource=Resource.AI_TOKENS,
        period=this_period(),
        threshold_pct=85,
        used=85_000,
        total=100_000,
    )
    await publish(settings, QUOTA_THRESHOLDS.name, [crossing], key=lambda e: str(e.account_id))
    account_id = uuid.UUID(account["id"])
    await eventually(lambda: all_settled(settings, account_id))
    assert firing_count(settings, account_id) == 1 and delivery_statuses(settings, account_id) == {"sent": 1}
    for reader in (owner, developer):  # one inbox, the account's: the one notice, for each of its users
        items = (await client.get("/api/notifications", headers=reader)).json()["items"]
        assert [(n["kind"], n["threshold_pct"]) for n in items] == [("quota_threshold", 80)], items


async def test_an_unknown_foreign_or_removed_user_id_is_422_alike(client):
    _, owner = await signup(client)
    stranger_account, stranger = await signup(client)
    strangers_member = await add(client, stranger, "viewer")
    leaver = await add(client, owner, "viewer")
    # alerts knows both members (each is accepted in its own account), then the leaver is removed
    await create_once_known(client, stranger, in_site_rule(strangers_member["id"]))
    await create_once_known(client, owner, in_site_rule(leaver["id"]))
    assert (await client.delete(f"/api/account/members/{leaver['id']}", headers=owner)).status_code == 204

    async def refused(user_id: str) -> bool:
        response = await client.post("/api/ai/usage/alert", json=in_site_rule(user_id), headers=owner)
        assert response.status_code in (201, 422), response.text
        if response.status_code == 201:  # the removal not read yet: undo and ask again
            assert (await client.delete(f"/api/ai/usage/alert/{response.json()['id']}", headers=owner)).status_code == 204
            return False
        error = response.json()["error"]
        assert error["code"] == "validation_error" and error["details"] == NOT_A_USER, error
        return True

    await eventually(lambda: refused(leaver["id"]))
    for user_id in (str(uuid.uuid4()), strangers_member["id"], stranger_account["id"]):
        assert await refused(user_id)
    assert len((await client.get("/api/ai/usage/alert", headers=owner)).json()["rules"]) == 1  # the first one only
