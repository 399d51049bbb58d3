"""Two real `serve` processes: a toggle, delete, expiry or rotation answered by one is in force
in both (lag measured), and the secret is nowhere: logs, Postgres rows, Kafka messages."""

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
import pytest
from aiokafka import AIOKafkaConsumer
from psycopg import sql

from contracts.credentials import hash_secret
from contracts.rate_limit import RateLimit
from tests.integration.test_edge_rate_limit import publish_plan
from tests.integration.test_keys_api import PASSWORD, bearer, code
from tests.support.apps import ServeProcess

pytestmark = pytest.mark.integration
GEO = "/api/geo/projects"


async def _rejected_within(client: httpx.AsyncClient, secret: str, *expected: str, deadline_s: float = 5.0) -> float:
    """Seconds until `client`'s process rejects the key with `expected` (polled as fast as it answers)."""
    started = time.perf_counter()
    while True:
        response = await client.get(GEO, headers=bearer(secret))
        if response.status_code == 401 and code(response) in expected:
            return time.perf_counter() - started
        assert response.status_code == 200, response.text
        assert time.perf_counter() - started < deadline_s, f"still accepted after {deadline_s} s"


async def _accepted_within(client: httpx.AsyncClient, secret: str, deadline_s: float = 10.0) -> None:
    started = time.perf_counter()
    while (await client.get(GEO, headers=bearer(secret))).status_code != 200:
        assert time.perf_counter() - started < deadline_s
        await asyncio.sleep(0.01)


def _all_postgres_rows(database_url: str) -> str:
    chunks: list[str] = []
    with psycopg.connect(database_url) as conn:
        tables = conn.execute(
            """SELECT table_schema, table_name FROM information_schema.tables
               WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')"""
        ).fetchall()
        for schema, table in tables:
            query = sql.SQL("SELECT row_to_json(t)::text FROM {} AS t").format(sql.Identifier(schema, table))
            chunks += [row[0] for row in conn.execute(query)]
    assert any("keys" in str(t) for t in tables)
    return "\n".join(chunks)


async def _all_kafka_messages(settings) -> bytes:
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap_servers, auto_offset_reset="earliest")
    await consumer.start()
    try:
        topics = sorted(t for t in await consumer.topics() if t.startswith(settings.topic_prefix))
        consumer.subscribe(topics)
        chunks: list[bytes] = []
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < 2.0:
            batches = await consumer.getmany(timeout_ms=300)
            for records in batches.values():
                idle_since = time.monotonic()
                for r in records:
                    chunks += [r.key or b"", r.value or b""] + [v for _, v in r.headers]
        return b"\n".join(chunks)
    finally:
        await consumer.stop()


async def test_two_processes_reject_at_once_and_the_secret_is_nowhere(settings):
    # Two replicas serving keys and geo (each has its own edge; chdb-based metering is not needed).
    a, b = ServeProcess(settings, "keys,geo"), ServeProcess(settings, "keys,geo")
    secrets_seen: list[str] = []
    try:
        a.wait_ready()
        b.wait_ready()
        async with (
            httpx.AsyncClient(base_url=a.base_url, timeout=10) as on_a,
            httpx.AsyncClient(base_url=b.base_url, timeout=10) as on_b,
        ):
            email = "two@example.com"
            body = {"email": email, "password": PASSWORD, "name": "Two", "user_type": "enterprise"}
            registered = await on_a.post("/api/auth/register", json=body)
            assert registered.status_code == 201
            # a plan whose rate limits leave room for polling as fast as the processes answer
            roomy = RateLimit(per_second=10_000, burst=10_000, per_minute=1_000_000)
            await publish_plan(settings, uuid.UUID(registered.json()["id"]), roomy)
            token = (await on_a.post("/api/auth/login", json={"email": email, "password": PASSWORD})).json()["access_token"]
            console = bearer(token)

            async def create(**extra: object) -> dict:
                response = await on_a.post("/api/api-keys", json={"name": "k", **extra}, headers=console)
                assert response.status_code == 201, response.text
                secrets_seen.append(response.json()["key"])
                return response.json()

            key = await create()
            await _accepted_within(on_b, key["key"])

            # toggle answered by A: A rejects at once, B within milliseconds
            lags = []
            for _ in range(3):
                off = await on_a.post(f"/api/api-keys/{key['id']}/toggle", headers=console)
                assert off.json()["status"] == "disabled"
                now_a = await on_a.get(GEO, headers=bearer(key["key"]))
                assert (now_a.status_code, code(now_a)) == (401, "api_key_disabled")
                lags.append(await _rejected_within(on_b, key["key"], "api_key_disabled"))
                assert (await on_a.post(f"/api/api-keys/{key['id']}/toggle", headers=console)).json()["status"] == "enabled"
                assert (await on_a.get(GEO, headers=bearer(key["key"]))).status_code == 200
                await _accepted_within(on_b, key["key"])
            print(f"toggle-to-rejection lag on the other process: {[round(x * 1000, 1) for x in lags]} ms")

            # delete answered by B this time
            assert (await on_b.delete(f"/api/api-keys/{key['id']}", headers=console)).status_code == 204
            gone = await on_b.get(GEO, headers=bearer(key["key"]))
            assert (gone.status_code, code(gone)) == (401, "invalid_api_key")
            await _rejected_within(on_a, key["key"], "invalid_api_key")

            # expiry: both reject from the exact instant on, with no event at all
            expires_at = datetime.now(UTC) + timedelta(seconds=1.5)
            short = await create(expires_at=expires_at.isoformat())
            await _accepted_within(on_b, short["key"])
            await asyncio.sleep(max(0.0, (expires_at - datetime.now(UTC)).total_seconds()))
            for client in (on_a, on_b):
                late = await client.get(GEO, headers=bearer(short["key"]))
                assert (late.status_code, code(late)) == (401, "api_key_expired")

            # rotation with grace: both keys work on both processes, then only the new one
            old = await create()
            await _accepted_within(on_b, old["key"])
            rotated = await on_b.post(f"/api/api-keys/{old['id']}/rotate", json={"grace_seconds": 1}, headers=console)
            assert rotated.status_code == 201
            new = rotated.json()
            secrets_seen.append(new["key"])
            assert (await on_b.get(GEO, headers=bearer(new["key"]))).status_code == 200
            await _accepted_within(on_a, new["key"])
            for client in (on_a, on_b):
                await _rejected_within(client, old["key"], "api_key_expired", "invalid_api_key")
                assert (await client.get(GEO, headers=bearer(new["key"]))).status_code == 200
    finally:
        a.stop()
        b.stop()

    # The secret is nowhere; its hash is (so the search below does read the data).
    logs = a.log_path.read_text() + b.log_path.read_text()
    rows = _all_postgres_rows(settings.database_url)
    messages = await _all_kafka_messages(settings)
    assert len(secrets_seen) == 4
    for secret in secrets_seen:
        body = secret.removeprefix("sk-")
        assert body not in logs
        assert body not in rows
        assert body.encode() not in messages
        assert hash_secret(secret) in rows
        assert hash_secret(secret).encode() in messages
