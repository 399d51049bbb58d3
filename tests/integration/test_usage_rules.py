"""One validator on both ways in (issue 15 item 2), on real Kafka, Postgres and the ClickHouse
engine: HTTP refuses a batch with a bad event whole (422, details by index, nothing published);
on Kafka a bad record goes to usage.v1.dlq with the reason, once per consumer group, nothing of
it is counted by quota or metering, and a valid event after it is. A call event outside the
rules' time window goes to calls.v1.dlq the same way (issue 41, item 5)."""

import json
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from aiokafka import AIOKafkaProducer

from contracts.events import CallEvent
from contracts.topics import CALLS, USAGE, Topic, dead_letter
from tests.integration.test_keys_api import signup
from tests.support.metering import metering_sink, wait_until
from tests.support.service_tokens import service_headers
from tests.support.topics import topic_records

pytestmark = pytest.mark.integration
INGEST = "/api/usage/events"


@pytest.fixture
def settings(module_settings):
    return module_settings


@pytest.fixture
def app_client(module_app_client):
    """Each test signs up an account of its own, and no test but the one that checks a dead-letter
    topic puts a record on it: one platform for the module (conftest.module_app_client)."""
    return module_app_client


def usage(account_id: str, quantity: int, *, time: datetime | None = None, resource: str = "ai_tokens", **extra) -> dict:
    return {
        "id": str(uuid.uuid4()),
        "time": (time or datetime.now(UTC)).isoformat(),
        "account_id": account_id,
        "resource": resource,
        "quantity": quantity,
        "provider": "openai",
        "model": "gpt-4o",
        "source": "rules-test",
        **extra,
    }


def _usage_groups(app, of: Topic = USAGE) -> int:
    """How many consumer groups read usage.v1 (or `of`; each dead-letters a bad record once)."""
    topic = app.state.runtime.settings.topic(of.name)
    subscribers = sum(topic in s.topic_names for s in app.state.runtime.broker.subscribers)
    return subscribers + sum(s.topic == topic for s in metering_sink(app).topics)


async def _quota_used(settings, account_id: str) -> int:
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        cur = await conn.execute("SELECT coalesce(sum(used), 0) FROM quota.counters WHERE account_id = %s", [account_id])
        row = await cur.fetchone()
    return int(row[0])


async def test_http_refuses_the_whole_batch_with_details_by_index_and_publishes_nothing(app_client, settings):
    _, client = app_client
    account, console = await signup(client)
    service = await service_headers(client, settings)
    now = datetime.now(UTC)
    good = usage(account["id"], 30, input_tokens=10, output_tokens=20)
    batch = [
        good,
        usage(account["id"], -50_000),  # 1: the exploit
        usage(account["id"], 31, input_tokens=10, output_tokens=20),  # 2: tokens disagree
        usage(account["id"], 1, time=now + timedelta(minutes=6)),  # 3: ahead
        usage(account["id"], 1, time=now - timedelta(days=36)),  # 4: too far back
        usage(account["id"], 10**12 + 1, resource="storage_bytes"),  # 5: absurd
        usage(account["id"], -5, resource="geo_projects"),  # a stock's delta: fine
    ]
    refused = await client.post(INGEST, json={"events": batch}, headers=service)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "validation_error" and error["request_id"] == refused.headers["X-Request-ID"]
    by_index = {d["index"]: d for d in error["details"]}
    assert sorted(by_index) == [1, 2, 3, 4, 5] and len(error["details"]) == 5
    assert all(by_index[i]["field"] == f"events.{i}" for i in by_index)
    assert "negative" in by_index[1]["message"] and "input_tokens + output_tokens" in by_index[2]["message"]
    assert "5 minutes" in by_index[3]["message"] and "35 days" in by_index[4]["message"]
    assert "10^12" in by_index[5]["message"]

    # nothing of the batch was published or remembered: the good event is new when sent alone
    published = await topic_records(settings.kafka_bootstrap_servers, settings.topic(USAGE.name))
    assert not [r for r in published if any(e["id"].encode() in r.value for e in batch)]
    accepted = await client.post(INGEST, json={"events": [good]}, headers=service)
    assert accepted.json() == {"accepted": 1, "duplicates": 0}
    # and the customer cannot try either way
    assert (await client.post(INGEST, json={"events": [good]}, headers=console)).status_code == 403


async def test_http_refuses_a_token_count_above_10_to_the_12(app_client, settings):
    """One token count alone is compared with nothing; metering sums it as the event's tokens, and
    three of 2^63 - 1 wrapped the UInt64 sums: an event of quantity 3 showed 9.2e18 tokens."""
    _, client = app_client
    account, _ = await signup(client)
    service = await service_headers(client, settings)
    batch = [
        usage(account["id"], 3, input_tokens=10**12),  # at the bound: fine
        usage(account["id"], 3, input_tokens=2**63 - 1),
        usage(account["id"], 1, resource="ai_conversations", output_tokens=10**12 + 1),
    ]
    refused = await client.post(INGEST, json={"events": batch}, headers=service)
    assert refused.status_code == 422, refused.text
    details = refused.json()["error"]["details"]
    assert [(d["index"], d["message"].split(":")[0]) for d in details] == [(1, "input_tokens"), (2, "output_tokens")]
    assert all("above 10^12" in d["message"] for d in details)


async def test_http_refuses_an_event_without_its_id_so_a_retry_is_never_counted_twice(app_client, settings):
    """The event id is the idempotency key: an id invented by the server would be new at every
    retry of the same request (a timeout, a 503), and the same usage would be counted again."""
    _, client = app_client
    account, _ = await signup(client)
    service = await service_headers(client, settings)
    without_id = {k: v for k, v in usage(account["id"], 5, resource="content_publishes").items() if k != "id"}
    for _ in range(2):  # the platform service's retry
        refused = await client.post(INGEST, json={"events": [without_id]}, headers=service)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["code"] == "validation_error"
        assert [(d["field"], d["type"]) for d in error["details"]] == [("events.0.id", "missing")]


async def test_a_bad_record_on_kafka_is_dead_lettered_by_every_consumer_and_never_counted(app_client, settings):
    app, client = app_client
    account, console = await signup(client)
    groups = _usage_groups(app)
    assert groups == 2  # quota.usage and metering.usage
    topic = settings.topic(USAGE.name)
    now = datetime.now(UTC)
    now_ms = int(now.timestamp() * 1000)
    old = now - timedelta(days=40)
    # (event, record timestamp): judged against the record's timestamp, not the consumer's clock
    bad = [
        (usage(account["id"], -50_000), None),
        (usage(account["id"], 31, input_tokens=10, output_tokens=20), None),
        (usage(account["id"], 5, time=now + timedelta(minutes=6)), now_ms),
        (usage(account["id"], 5, time=old), now_ms),  # 40 days before its record
        (usage(account["id"], 5, time=now), int((now - timedelta(minutes=10)).timestamp() * 1000)),  # ahead of its record
        (usage(account["id"], 10**12 + 1, resource="storage_bytes"), None),
        (usage(account["id"], 3, input_tokens=2**63 - 1), None),  # a token count alone, absurd
    ]
    backfilled = usage(account["id"], 11, time=old, input_tokens=5, output_tokens=6)  # history, stamped as such
    valid = usage(account["id"], 77, input_tokens=70, output_tokens=7)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
    await producer.start()
    try:
        key = account["id"].encode()  # one partition: the valid event is read after the bad ones
        for event, stamp in bad:
            await producer.send_and_wait(topic, json.dumps(event).encode(), key=key, timestamp_ms=stamp)
        await producer.send_and_wait(topic, json.dumps(backfilled).encode(), key=key, timestamp_ms=int(old.timestamp() * 1000))
        await producer.send_and_wait(topic, json.dumps(valid).encode(), key=key)
    finally:
        await producer.stop()

    since_old = {"range": "custom", "start": (old - timedelta(days=1)).isoformat(), "end": (now + timedelta(days=1)).isoformat()}

    async def counted() -> tuple[int, int, int] | None:
        quota = (await client.get("/api/billing/check-quota", headers=console)).json()["items"]
        tokens = next(i["used"] for i in quota if i["resource"] == "ai_tokens")
        overview = await client.get("/api/ai/usage/overview", params=since_old, headers=console)
        assert overview.status_code == 200, overview.text
        metered = overview.json()["total_tokens"]
        got = (tokens, metered, await _quota_used(settings, account["id"]))
        return got if got == (77, 77 + 11, 77 + 11) else None

    await wait_until(counted, timeout=60, interval=0.2)

    # every bad record is in the DLQ once per group, with its reason; the good ones are not
    reasons: Counter[str] = Counter()
    ids = {e["id"] for e, _ in bad}
    for record in await topic_records(settings.kafka_bootstrap_servers, settings.topic(dead_letter(USAGE).name)):
        headers = dict(record.headers)
        event_id = json.loads(record.value)["id"]
        assert event_id in ids, "only the bad records are dead-lettered"
        assert headers["x-original-topic"] == topic.encode()
        reasons[event_id] += 1
        reason = headers["x-error"].decode()
        assert reason.startswith(("quantity:", "time:", "input_tokens:")), reason
    assert reasons == {i: groups for i in ids}

    # nothing of them was counted (already settled above), nor is later: the counts stay put
    assert await counted() is not None
    quota = (await client.get("/api/billing/check-quota", headers=console)).json()["items"]
    assert next(i for i in quota if i["resource"] == "storage_bytes")["used"] == 0


async def test_a_call_outside_the_time_window_is_dead_lettered_by_every_consumer_and_never_counted(app_client, settings):
    app, client = app_client
    account, console = await signup(client)
    groups = _usage_groups(app, CALLS)
    assert groups == 3  # quota.calls, keys.last-used and metering.calls
    now = datetime.now(UTC)

    def call(time: datetime) -> CallEvent:
        return CallEvent(
            time=time,
            account_id=account["id"],
            api_key_id=uuid.uuid4(),
            method="GET",
            path="/api/geo/projects",
            status=200,
            ip="10.0.0.1",
            latency_ms=2,
        )

    bad = [call(now - timedelta(days=36)), call(now + timedelta(minutes=6))]  # judged against their records, stamped now
    valid = call(now)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
    await producer.start()
    try:
        for event in [*bad, valid]:  # one partition: the valid call is read after the bad ones
            await producer.send_and_wait(settings.topic(CALLS.name), event.model_dump_json().encode(), key=account["id"].encode())
    finally:
        await producer.stop()

    async def counted() -> bool:
        quota = (await client.get("/api/billing/check-quota", headers=console)).json()["items"]
        calls = next(i["used"] for i in quota if i["resource"] == "api_calls")
        return (calls, await _quota_used(settings, account["id"])) == (1, 1)

    await wait_until(counted, timeout=60, interval=0.2)
    reasons: Counter[str] = Counter()

    async def all_dead_lettered() -> bool:
        reasons.clear()
        for record in await topic_records(settings.kafka_bootstrap_servers, settings.topic(dead_letter(CALLS).name)):
            assert dict(record.headers)["x-error"].decode().startswith("time: more than")
            reasons[json.loads(record.value)["id"]] += 1
        return reasons == {str(e.id): groups for e in bad}

    await wait_until(all_dead_lettered, timeout=30, interval=0.5)
    since = {"start": (now - timedelta(days=40)).isoformat(), "end": (now + timedelta(hours=1)).isoformat()}

    async def logged() -> list | None:  # metering wrote the valid call alone
        r = await client.get("/api/activity-log", params=since, headers=console)
        assert r.status_code == 200, r.text
        return r.json()["items"] or None

    (item,) = await wait_until(logged, timeout=30)
    assert item["api_key_id"] == str(valid.api_key_id)
