"""Issue #41, item 7, on the real stack: two keys services on one Postgres and one Kafka, the
second's clock a minute behind the first's, toggle one key one after the other and at the same
time. Each state is stamped with its service's clock, so its `time` says nothing about which
write came last; the version taken under the row lock does. Every edge (the two services' own,
and one that reads keys.v1 from the start) ends where Postgres is."""

import asyncio
import json
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer

from contracts.common import KeyStatus, Tier, UserType
from contracts.credentials import hash_secret
from contracts.events import KeyState
from contracts.plans import catalogue
from contracts.topics import KEYS
from services.billing.store import BillingStore
from services.edge import Overrides
from services.edge.projections import KeyProjection
from services.keys.store import KeysStore
from services.quota.store import QuotaStore
from services.runtime.platform.outbox_relay import OutboxRelay
from services.runtime.platform.settings import Settings
from tests.integration.test_alerts_helpers import eventually
from tests.integration.test_alerts_key_rotation import login, register
from tests.integration.test_keys_api import new_key
from tests.support.apps import running_app

pytestmark = pytest.mark.integration


def behind(seconds: float):
    return lambda: datetime.now(UTC) - timedelta(seconds=seconds)


def status_in_postgres(settings: Settings, key_id: str) -> KeyStatus:
    with psycopg.connect(settings.database_url) as conn:
        row = conn.execute("SELECT status FROM keys.api_keys WHERE id = %s", (key_id,)).fetchone()
    assert row is not None
    return KeyStatus(row[0])


async def replayed_keys(settings: Settings) -> KeyProjection:
    """A new edge's view: keys.v1 read from the start, until it stays quiet for a second."""
    projection = KeyProjection()
    consumer = AIOKafkaConsumer(
        settings.topic(KEYS.name), bootstrap_servers=settings.kafka_bootstrap_servers, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < 1.0:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                idle_since = time.monotonic()
                for record in records:
                    if record.value is not None:
                        projection.apply(KeyState.model_validate(json.loads(record.value)))
    finally:
        await consumer.stop()
    return projection


async def test_racing_toggles_on_skewed_replicas_end_with_every_edge_agreeing_with_postgres(settings):
    async with (
        running_app(settings, ("keys",), overrides=Overrides(clock=behind(0))) as (app_a, on_a),
        running_app(settings, ("keys",), overrides=Overrides(clock=behind(60))) as (app_b, on_b),
    ):
        _account, email = await register(on_a)
        console = await login(on_a, email)
        key = await new_key(on_a, console)
        digest = hash_secret(key["key"])
        edges = {"a": app_a.state.runtime.edge, "b": app_b.state.runtime.edge}

        def edge_status(name: str) -> KeyStatus | None:
            state = edges[name].keys.get(digest)
            return None if state is None else state.status

        await eventually(lambda: edge_status("b") is KeyStatus.ENABLED)

        async def toggle(client) -> str:
            answer = await client.post(f"/api/api-keys/{key['id']}/toggle", headers=console)
            assert answer.status_code == 200, answer.text
            return str(answer.json()["status"])

        # One after the other: A disables at 12:00, then B enables at (its) 11:59.
        assert await toggle(on_a) == "disabled"
        assert await toggle(on_b) == "enabled"
        # Then at the same time, some rounds: the row lock decides who goes first.
        for _ in range(5):
            await asyncio.gather(toggle(on_a), toggle(on_b), toggle(on_a))
        assert await toggle(on_b) in ("enabled", "disabled")

        truth = status_in_postgres(settings, key["id"])
        for name in edges:
            try:
                await eventually(lambda name=name: edge_status(name) is truth, within=5.0)
            except AssertionError:
                raise AssertionError(f"edge {name} holds {edge_status(name)}, Postgres {truth}") from None
    replayed = (await replayed_keys(settings)).get(digest)
    assert replayed is not None and replayed.status is truth


async def test_plans_and_user_types_are_kept_by_version_in_postgres(settings, pool):
    """The SQL of billing, quota and keys: the fact of the higher version stands, whatever its time."""
    account = uuid.uuid4()
    now = datetime.now(UTC)
    earlier = now - timedelta(minutes=1)
    async with BillingStore(pool).transaction() as tx:
        await tx.lock_account(account, UserType.INDIVIDUAL, None, 0)
        first = await tx.set_plan(account, Tier.BASIC, now, "2026-11")
        assert await tx.set_plan(account, Tier.FREE, earlier, "2026-11") == first + 1
        await tx.set_user_type(account, UserType.ENTERPRISE, earlier, 3)
        await tx.set_user_type(account, UserType.INDIVIDUAL, now, 2)
        row = await tx.lock_account(account, UserType.INDIVIDUAL, None, 0)
        assert (row.user_type, row.user_type_version) == (UserType.ENTERPRISE, 3)

    plans = catalogue()
    async with QuotaStore(pool).transaction() as tx:
        await tx.lock_accounts([account])
        assert await tx.set_plan(account, Tier.BASIC, plans[Tier.BASIC].quotas, earlier, 2)
        assert not await tx.set_plan(account, Tier.PROFESSIONAL, plans[Tier.PROFESSIONAL].quotas, now, 1)

    async with KeysStore(pool, OutboxRelay(pool, settings, "keys")).transaction() as tx:
        registered = await tx.insert_account(
            account_id=account, email=f"{account}@example.com", password_hash="x", name="A", user_type="individual", roles=[]
        )
        assert registered is not None and registered["version"] == 1
        await tx.set_plan(account, "basic", earlier, 2)
        await tx.set_plan(account, "professional", now, 1)
        stored = await tx.account_by_id(account)
        assert stored is not None and stored["plan"] == "basic"
