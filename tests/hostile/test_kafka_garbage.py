"""Malformed and oversized messages on every consumed topic, published to the real broker while the
whole platform runs: consumer-group consumers dead-letter them to `<topic>.dlq` (once per group)
and go on; the edge's and metering's projection followers skip them and go on. Garbage is put on
every partition before the valid events, so each valid event is read after garbage on its own
partition."""

import hashlib
import json
import secrets
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from contracts.common import KeyStatus, Resource, Role, ServiceScope, UserType
from contracts.events import AccountState, KeyState, QuotaState, ServiceTokenState, SessionRevoked, UserState
from contracts.topics import ACCOUNTS, ALL_TOPICS, KEYS, QUOTA, SERVICE_TOKENS, SESSIONS, STATE_COMPLETE, USERS, dead_letter
from services.edge.edge import Edge
from services.runtime.platform.settings import Settings
from tests.hostile.helpers import bearer, eventually, new_account, new_key
from tests.support.metering import metering_sink
from tests.support.service_tokens import service_headers

pytestmark = pytest.mark.integration

HUGE = 1_000_000  # just under the broker's default message.max.bytes (1 MiB)


def _garbage(marker: str) -> dict[str, bytes]:
    return {
        "not-json": b"\xff\xfe\x00 this is not JSON " + marker.encode(),
        "wrong-schema": json.dumps({"id": "not-a-uuid", "type": "usage", "account_id": 7, "marker": marker}).encode(),
        "wrong-shape": json.dumps([marker, 1, None]).encode(),
    }


def _huge(marker: str) -> bytes:
    return json.dumps({"marker": marker, "pad": "x" * HUGE}).encode()[:HUGE]  # cut: not even valid JSON


def _consumers_per_topic(app) -> Counter[str]:
    """How many consumer groups read each topic (each dead-letters a bad message once): the
    FastStream subscribers and the metering sink's own consumers."""
    counts: Counter[str] = Counter()
    for subscriber in app.state.runtime.broker.subscribers:
        for name in subscriber.topic_names:
            counts[name] += 1
    for sink in metering_sink(app).topics:
        counts[sink.topic] += 1
    return counts


async def _publish_garbage(settings: Settings, marker: str) -> dict[str, int]:
    """Every small payload on every partition of every topic, the huge one on partition 0; returns
    the number of garbage messages per topic."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, max_request_size=2 * 1024 * 1024)
    await producer.start()
    sent: dict[str, int] = {}
    try:
        for topic in ALL_TOPICS:
            name = settings.topic(topic.name)
            partitions = sorted(await producer.partitions_for(name))
            assert len(partitions) == topic.partitions
            for partition in partitions:
                for payload in _garbage(marker).values():
                    await producer.send_and_wait(name, payload, key=b"garbage-" + marker.encode(), partition=partition)
            await producer.send_and_wait(name, _huge(marker), key=b"huge", partition=0)
            sent[name] = len(partitions) * len(_garbage(marker)) + 1
        # A tombstone with a key that is not a key id: the followers of keys.v1 must skip it too.
        await producer.send_and_wait(settings.topic(KEYS.name), None, key=b"not-a-uuid", partition=0)
        await producer.send_and_wait(settings.topic(SERVICE_TOKENS.name), None, key=b"not-a-uuid", partition=0)
    finally:
        await producer.stop()
    return sent


async def _dead_letters(settings: Settings, marker: str, expected: dict[str, int], within: float = 60) -> Counter[str]:
    """Count the dead letters carrying `marker`, by original topic, until `expected` is reached."""
    names = [settings.topic(dead_letter(t).name) for t in ALL_TOPICS]
    consumer = AIOKafkaConsumer(
        *names,
        bootstrap_servers=settings.kafka_bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_bytes=16 * 1024 * 1024,
    )
    await consumer.start()
    found: Counter[str] = Counter()
    try:

        async def caught_up() -> bool:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for record in records:
                    headers = dict(record.headers)
                    if marker.encode() in (record.value or b"") and headers.get("x-error"):
                        found[headers["x-original-topic"].decode()] += 1
            return all(found[t] >= n for t, n in expected.items())

        try:
            await eventually(caught_up, within=within, what="dead letters")
        except AssertionError:
            pass  # compared below, with the numbers in the message
        # No more than expected either (nothing dead-lettered twice by one group).
        await consumer.getmany(timeout_ms=1000)
    finally:
        await consumer.stop()
    return found


async def test_garbage_on_every_topic_is_dead_lettered_and_every_consumer_keeps_working(app_client, settings: Settings):
    app, client = app_client
    groups = _consumers_per_topic(app)
    # service-tokens.v1, sessions.v1, state-complete.v1: read by projection followers only
    # (keys.v1 also by alerts.keys, the rotation reminder's key ages; users.v1 also by alerts.users,
    # the accounts' users a rule's {user_id} recipient must be one of)
    followed_only = {settings.topic(t.name) for t in (SERVICE_TOKENS, SESSIONS, STATE_COMPLETE)}
    assert set(groups) == {settings.topic(t.name) for t in ALL_TOPICS} - followed_only

    a = await new_account(client)
    key = await new_key(client, a)
    marker = uuid.uuid4().hex
    sent = await _publish_garbage(settings, marker)

    # ---- valid traffic after the garbage -------------------------------------------------------
    # usage.v1 (quota, metering.usage) and, through quota, quota.v1 and quota-thresholds.v1 (alerts)
    quota = (await client.get("/api/billing/check-quota", headers=a.headers)).json()
    tokens_total = next(i["total"] for i in quota["items"] if i["resource"] == "ai_tokens")
    rule40 = await client.post(
        "/api/ai/usage/alert",
        json={"metric": "total_tokens", "threshold_pct": 40, "channels": ["in_site"], "recipients": []},
        headers=a.headers,
    )
    assert rule40.status_code == 201, rule40.text
    half = tokens_total // 2
    usage = {
        "id": str(uuid.uuid4()),
        "time": datetime.now(UTC).isoformat(),
        "account_id": a.id,
        "resource": "ai_tokens",
        "quantity": half,
        "provider": "openai",
        "model": "gpt-4o",
        "input_tokens": half,
        "output_tokens": 0,
        "source": "hostile-test",
    }
    ingested = await client.post("/api/usage/events", json={"events": [usage]}, headers=await service_headers(client, settings))
    assert ingested.status_code == 202 and ingested.json()["accepted"] == 1

    async def notified() -> bool:
        return bool((await client.get("/api/notifications", headers=a.headers)).json()["items"])

    # Before the upgrade below: quota applying the larger plan first would leave this usage under 40%.
    await eventually(notified, what="alerts fired the 40% rule from quota-thresholds.v1")

    # calls.v1 (keys.last-used, quota, metering.calls)
    call = await client.get("/api/geo/projects", headers=bearer(key["key"]))
    assert call.status_code == 200 and call.headers["X-RateLimit-Limit"] == "20"  # free plan's burst: the tightest limit

    # accounts.v1 (billing) and billing.v1 (billing, keys.plans, quota)
    changed = await client.put("/api/account/user-type", json={"user_type": "enterprise"}, headers=a.headers)
    assert changed.status_code == 200
    order = await client.post("/api/billing/orders", json={"kind": "plan_upgrade", "plan": "basic"}, headers=a.headers)
    assert order.status_code == 201, order.text
    assert (await client.post(f"/api/billing/orders/{order.json()['id']}/pay", headers=a.headers)).status_code == 200
    b = await new_account(client, user_type="enterprise")

    # The edge's followers (keys.v1, accounts.v1, quota.v1), fed directly as their owners would.
    synthetic = uuid.uuid4()
    now = datetime.now(UTC)
    secret = "sk-" + secrets.token_urlsafe(36)
    mask = f"sk-{secret[3:7]}...{secret[-4:]}"
    broker = app.state.runtime.broker
    await broker.publish(
        AccountState(time=now, account_id=synthetic, roles=[Role.OWNER], user_type=UserType.INDIVIDUAL),
        settings.topic(ACCOUNTS.name),
        key=str(synthetic).encode(),
    )
    await broker.publish(
        KeyState(
            time=now,
            account_id=synthetic,
            key_id=uuid.uuid4(),
            hash=hashlib.sha256(secret.encode()).hexdigest(),
            status=KeyStatus.ENABLED,
            roles=[Role.OWNER],
            masked_key=mask,
        ),
        settings.topic(KEYS.name),
        key=str(synthetic).encode(),
    )
    await broker.publish(
        QuotaState(
            time=now,
            account_id=synthetic,
            resource=Resource.GEO_PROJECTS,
            period=now.strftime("%Y-%m"),
            total=0,
            used=0,
            blocked=True,
        ),
        settings.topic(QUOTA.name),
        key=f"{synthetic}:geo_projects".encode(),
    )
    service_token = "st-" + secrets.token_urlsafe(36)
    await broker.publish(
        ServiceTokenState(
            time=now,
            token_id=synthetic,
            name="synthetic",
            hash=hashlib.sha256(service_token.encode()).hexdigest(),
            scopes=[ServiceScope.USAGE_WRITE],
        ),
        settings.topic(SERVICE_TOKENS.name),
        key=str(synthetic).encode(),
    )
    session = bearer(Edge(settings).issue_session(synthetic, "sid", now))
    # users.v1 (edge followers and alerts) and sessions.v1 (edge followers only): a logged-out session and a password change
    logged_out = bearer(Edge(settings).issue_session(synthetic, "logged-out", now))
    await broker.publish(
        SessionRevoked(time=now, account_id=synthetic, session_id="logged-out", user_id=synthetic, revoked_at=now),
        settings.topic(SESSIONS.name),
        key=b"logged-out",
    )
    other = uuid.uuid4()  # a second synthetic account whose user changed its password after `now`
    await broker.publish(
        AccountState(time=now, account_id=other, roles=[Role.OWNER], user_type=UserType.INDIVIDUAL),
        settings.topic(ACCOUNTS.name),
        key=str(other).encode(),
    )
    before_change = bearer(Edge(settings).issue_session(other, "before", now))
    after_change = bearer(Edge(settings).issue_session(other, "after", now + timedelta(seconds=2)))
    await broker.publish(
        UserState(time=now, account_id=other, user_id=other, role=Role.OWNER, sessions_not_before=now + timedelta(seconds=1)),
        settings.topic(USERS.name),
        key=str(other).encode(),
    )

    # ---- every consumer got past the garbage ----------------------------------------------------
    async def counted() -> bool:
        items = {i["resource"]: i for i in (await client.get("/api/billing/check-quota", headers=a.headers)).json()["items"]}
        return (
            items["ai_tokens"]["used"] == half and items["api_calls"]["used"] >= 1 and items["ai_tokens"]["total"] > tokens_total
        )

    await eventually(counted, what="quota counted usage.v1 and calls.v1 and applied plan_changed")

    async def metered() -> bool:
        overview = (await client.get("/api/ai/usage/overview?range=today", headers=a.headers)).json()
        log = (await client.get("/api/activity-log", headers=a.headers)).json()["items"]
        mine = [i for i in log if i["api_key_id"] == key["id"]]
        return overview["total_tokens"] == half and mine and mine[0]["masked_key"] == key["masked_key"]

    await eventually(metered, what="metering wrote usage.v1 and calls.v1; its keys.v1 follower knows the mask")

    async def alerts_saw_the_state() -> bool:
        async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
            row = await (
                await conn.execute(
                    "SELECT used FROM alerts.quota_states WHERE account_id = %s AND resource = 'ai_tokens'", [a.id]
                )
            ).fetchone()
        return row is not None and row[0] == half

    await eventually(alerts_saw_the_state, what="alerts stored the quota.v1 state")

    async def alerts_saw_the_user() -> bool:
        async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
            row = await (await conn.execute("SELECT account_id FROM alerts.users WHERE user_id = %s", [other])).fetchone()
        return row is not None and row[0] == other

    await eventually(alerts_saw_the_user, what="alerts stored the users.v1 state")
    rule1 = await client.post(  # the upgrade below may have lowered the rate: 1% is passed whatever the plan
        "/api/ai/usage/alert",
        json={"metric": "total_tokens", "threshold_pct": 1, "channels": ["in_site"], "recipients": []},
        headers=a.headers,
    )
    assert rule1.json()["fired_this_period"] is True  # fired at creation from the stored quota.v1 state

    async def keys_and_billing_applied() -> bool:
        account = (await client.get("/api/account", headers=a.headers)).json()
        listed = (await client.get("/api/api-keys", headers=a.headers)).json()["items"]
        mine = (await client.get("/api/billing/subscription", headers=a.headers)).json()
        theirs = (await client.get("/api/billing/subscription", headers=b.headers)).json()
        return (
            account["plan"] == "basic"  # keys.plans read billing.v1
            and listed[0]["last_used_at"] is not None  # keys.last-used read calls.v1
            and mine["user_type"] == "enterprise"  # billing read user_type_changed from billing.v1
            and theirs["user_type"] == "enterprise"  # billing read accounts.v1
        )

    await eventually(keys_and_billing_applied, what="keys and billing consumers applied billing.v1, calls.v1, accounts.v1")

    async def edge_followed() -> bool:
        limit = (await client.get("/api/geo/projects", headers=bearer(key["key"]))).headers.get("X-RateLimit-Limit")
        by_key = await client.get("/api/geo/projects", headers=bearer(secret))
        by_session = await client.get("/api/geo/projects", headers=session)
        blocked = await client.post("/api/geo/projects", json={"name": "p"}, headers=session)
        by_service = await client.get("/api/geo/projects", headers=bearer(service_token))
        ended = [await client.get("/api/geo/projects", headers=h) for h in (logged_out, before_change)]
        after = await client.get("/api/geo/projects", headers=after_change)
        return (
            limit == "60"  # billing.v1 follower: the basic plan's burst (the tightest limit on an admitted call)
            and by_key.status_code == 200  # keys.v1 follower
            and by_session.status_code == 200  # accounts.v1 follower
            and blocked.status_code == 403
            and blocked.json()["error"]["code"] == "insufficient_quota"  # quota.v1 follower
            # service-tokens.v1 follower: a known service token (unknown would be 401) on a customer route
            and (by_service.status_code, by_service.json()["error"]["code"]) == (403, "permission_denied")
            # sessions.v1 and users.v1 followers: the same accounts' other sessions are accepted
            and all(r.status_code == 401 and r.json()["error"]["code"] == "invalid_session" for r in ended)
            and after.status_code == 200
        )

    await eventually(
        edge_followed,
        what="the edge's followers applied keys.v1, accounts.v1, quota.v1, billing.v1, service-tokens.v1, users.v1, sessions.v1",
    )

    async def masked() -> bool:
        log = (await client.get("/api/activity-log", headers=session)).json()["items"]
        return any(i["masked_key"] == mask for i in log)

    await eventually(masked, what="metering's keys.v1 follower knows the synthetic key's mask")

    # ---- and the garbage went to the dead-letter topics, once per consumer group -----------------
    expected = {topic: n * groups[topic] for topic, n in sent.items() if groups[topic]}
    found = await _dead_letters(settings, marker, expected)
    assert dict(found) == expected
    assert (await client.get("/readyz")).status_code == 200
