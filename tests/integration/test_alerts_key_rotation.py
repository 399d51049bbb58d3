"""(v2) The rotation reminder on the real stack: a key older than 90 days (by the clock of the
app's bootstrap) yields exactly one in-site notification, also after a restart and a replay of
keys.v1; a young key and a deleted key none; another account sees nothing of it."""

import asyncio
import uuid
from datetime import timedelta

import pytest

from contracts.common import KeyStatus, Role
from contracts.events import KeyState
from contracts.topics import KEYS
from services.edge import Overrides
from tests.integration.quota_helpers import SettableClock, publish
from tests.integration.test_alerts_helpers import eventually, query
from tests.integration.test_keys_api import PASSWORD, new_key
from tests.support.apps import running_app

pytestmark = pytest.mark.integration


async def login(client, email: str) -> dict[str, str]:
    answer = await client.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    assert answer.status_code == 200, answer.text
    return {"Authorization": f"Bearer {answer.json()['access_token']}"}


async def register(client) -> tuple[str, str]:
    email = f"u{uuid.uuid4().hex[:8]}@example.com"
    body = {"email": email, "password": PASSWORD, "name": "Ada", "user_type": "individual"}
    created = await client.post("/api/auth/register", json=body)
    assert created.status_code == 201, created.text
    return created.json()["id"], email


async def notifications(client, headers: dict[str, str]) -> list[dict]:
    answer = await client.get("/api/notifications", headers=headers)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["items"])


def reminders(settings) -> list[dict]:
    return query(settings, "SELECT account_id, api_key_id FROM alerts.notifications WHERE kind = 'key_rotation_due'")


async def test_a_key_older_than_90_days_gets_one_reminder_young_and_deleted_keys_none(settings):
    settings = settings.model_copy(update={"prune_interval_seconds": 0.3})  # the reminder pass, often
    clock = SettableClock()
    async with running_app(settings, overrides=Overrides(clock=clock)) as (_app, client):
        account, email = await register(client)
        other_account, other_email = await register(client)
        console = await login(client, email)
        old = await new_key(client, console, name="old")
        gone = await new_key(client, console, name="gone")
        assert (await client.delete(f"/api/api-keys/{gone['id']}", headers=console)).status_code == 204

        def known(key_id: str, deleted: bool = False) -> bool:
            rows = query(settings, "SELECT deleted FROM alerts.keys WHERE key_id = %s", uuid.UUID(key_id))
            return bool(rows) and rows[0]["deleted"] is deleted

        await eventually(lambda: known(old["id"]) and known(gone["id"], deleted=True))
        assert reminders(settings) == []  # nothing is old yet

        # 91 days later (the clock every use case reads): the old key is due, the deleted one never.
        clock.fixed = clock() + timedelta(days=91)
        young = KeyState(
            time=clock(),
            account_id=uuid.UUID(account),
            key_id=uuid.uuid4(),
            hash="a" * 64,
            status=KeyStatus.ENABLED,
            roles=[Role.OWNER],
            created_at=clock() - timedelta(days=1),
        )
        await publish(settings, KEYS.name, [young], key=lambda e: str(e.key_id))
        await eventually(lambda: known(str(young.key_id)))
        await eventually(lambda: len(reminders(settings)) == 1)
        console = await login(client, email)  # a fresh session at the new "now"
        items = [n for n in await notifications(client, console) if n["kind"] == "key_rotation_due"]
        assert len(items) == 1
        item = items[0]
        assert item["api_key_id"] == old["id"] and item["title"] == "Rotate this key"
        assert (item["metric"], item["threshold_pct"], item["links"], item["read"]) == (None, None, {}, False)
        assert old["masked_key"] in item["message"]

        # Another account sees nothing of it, and cannot mark it read.
        other = await login(client, other_email)
        assert await notifications(client, other) == []
        assert (await client.post(f"/api/notifications/{item['id']}/read", headers=other)).status_code == 404

        # Replays of keys.v1 (the old key's state again, a toggle) and more passes post nothing more.
        assert (await client.post(f"/api/api-keys/{old['id']}/toggle", headers=console)).status_code == 200
        replay = KeyState(
            time=clock(),
            account_id=uuid.UUID(account),
            key_id=uuid.UUID(old["id"]),
            hash="b" * 64,
            status=KeyStatus.ENABLED,
            roles=[Role.OWNER],
            created_at=clock() - timedelta(days=200),
        )
        await publish(settings, KEYS.name, [replay], key=lambda e: str(e.key_id))
        await asyncio.sleep(1.5)
    assert len(reminders(settings)) == 1

    # A restart: the reminder passes of the new process, and keys.v1 replayed once more, post nothing.
    async with running_app(settings, overrides=Overrides(clock=clock)) as (_app, client):
        await publish(settings, KEYS.name, [replay.model_copy(update={"id": uuid.uuid4()})], key=lambda e: str(e.key_id))
        await asyncio.sleep(1.5)  # a few reminder passes
        console = await login(client, email)
        items = [n for n in await notifications(client, console) if n["kind"] == "key_rotation_due"]
        assert [n["api_key_id"] for n in items] == [old["id"]]
    assert [(str(r["account_id"]), str(r["api_key_id"])) for r in reminders(settings)] == [(account, old["id"])]
    assert other_account != account
