"""POST /api/usage/events is idempotent within USAGE_IDEMPOTENCY_WINDOW_SECONDS: metering
forgets the ids accepted longer ago, keeps the newer ones, and a forgotten id is accepted again."""

import psycopg
import pytest

from tests.support.apps import running_app
from tests.support.metering import wait_until
from tests.support.platform import usage_event
from tests.support.service_tokens import operator_service_headers

pytestmark = pytest.mark.integration


async def test_ids_older_than_the_window_are_forgotten_and_accepted_again(settings):
    settings = settings.model_copy(update={"usage_idempotency_window_seconds": 3600, "prune_interval_seconds": 0.1})
    account = "5f0c6a53-4a52-4d7a-9d43-3c3f3e1f0b11"
    old, recent = usage_event(account, 100), usage_event(account, 200)
    async with (
        running_app(settings, targets=("metering",)) as (app, client),
        await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True) as conn,
    ):
        service = await operator_service_headers(app)
        r = await client.post("/api/usage/events", headers=service, json={"events": [old, recent]})
        assert r.status_code == 202 and r.json() == {"accepted": 2, "duplicates": 0}, r.text
        await conn.execute(
            "UPDATE metering.ingested_events SET received_at = now() - interval '61 minutes' WHERE id = %s", (old["id"],)
        )

        async def remembered() -> set[str]:
            cur = await conn.execute("SELECT id::text FROM metering.ingested_events")
            return {row[0] for row in await cur.fetchall()}

        async def only_recent() -> bool:
            return await remembered() == {recent["id"]}

        assert await remembered() == {old["id"], recent["id"]}
        await wait_until(only_recent, timeout=8)

        r = await client.post("/api/usage/events", headers=service, json={"events": [old, recent]})
        assert r.json() == {"accepted": 1, "duplicates": 1}, r.text
        assert await remembered() == {old["id"], recent["id"]}
