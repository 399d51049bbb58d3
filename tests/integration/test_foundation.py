"""The foundation against real parts: Kafka broker, Postgres server, the ClickHouse engine."""

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import psycopg
import pytest
from faststream.kafka import KafkaBroker
from psycopg import sql

from contracts.common import Resource
from contracts.events import UsageEvent
from contracts.topics import USAGE
from services.runtime.platform import clickhouse, postgres
from services.runtime.platform.kafka import ensure_topics

pytestmark = pytest.mark.integration


@pytest.fixture
def client(module_client):
    """The two HTTP checks read the platform and change nothing: one platform for the module."""
    return module_client


async def test_faststream_publishes_and_a_consumer_group_receives(settings):
    await ensure_topics(settings, (USAGE,))
    topic = settings.topic(USAGE.name)
    received: asyncio.Queue[UsageEvent] = asyncio.Queue()
    broker = KafkaBroker(settings.kafka_bootstrap_servers)

    @broker.subscriber(topic, group_id=settings.group("smoke"), auto_offset_reset="earliest")
    async def on_usage(event: UsageEvent) -> None:
        await received.put(event)

    sent = UsageEvent(time=datetime.now(UTC), account_id=uuid.uuid4(), resource=Resource.AI_TOKENS, quantity=42, source="smoke")
    async with broker:
        await broker.start()
        await broker.publish(sent, topic, key=str(sent.account_id).encode())
        got = await asyncio.wait_for(received.get(), 30)
    assert got == sent


def test_clickhouse_through_the_dsn_with_versioned_ddl(settings, tmp_path):
    (tmp_path / "0001_things.sql").write_text("CREATE TABLE {db}.things (id UUID, n UInt64) ENGINE = MergeTree ORDER BY id;")
    client = clickhouse.connect(settings.clickhouse_dsn)
    assert clickhouse.apply_migrations(client, settings.clickhouse_database, tmp_path) == ["0001_things.sql"]
    assert clickhouse.apply_migrations(client, settings.clickhouse_database, tmp_path) == []  # idempotent
    rows = [[uuid.uuid4(), n] for n in range(1, 101)]
    client.insert(f"{settings.clickhouse_database}.things", rows, column_names=["id", "n"])
    result = client.query(
        f"SELECT count(), sum(n) FROM {settings.clickhouse_database}.things WHERE n > {{lo:UInt64}}", parameters={"lo": 50}
    )
    assert result.result_rows == [(50, sum(range(51, 101)))]


async def test_the_whole_platform_starts_ready_with_health_and_metrics(client):
    ready = await client.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert set(ready.json()["checks"]) >= {"kafka", "postgres", "edge"}
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    metrics = await client.get("/metrics")
    assert "tollgate_http_request_seconds" in metrics.text


async def test_unknown_routes_answer_the_contract_error_body_with_the_request_id(client):
    response = await client.get("/api/no-such-thing", headers={"X-Request-ID": "req-123"})
    assert response.status_code == 404
    assert response.headers["X-Request-ID"] == "req-123"
    assert response.json() == {"error": {"code": "not_found", "message": "Not Found", "request_id": "req-123"}}


def test_processes_starting_together_migrate_one_service_without_tripping_over_each_other(database_url, tmp_path):
    """`tollgate up` starts its workers and its consumers' process at once, and each migrates:
    CREATE SCHEMA IF NOT EXISTS (and yoyo's bookkeeping tables) fail with a unique violation when
    two sessions create the same schema at the same moment, and a CREATE INDEX CONCURRENTLY (as
    the outbox migrations have) waits for a session blocked on the lock that serialises them.
    Many fresh services, raced 4 ways."""
    (tmp_path / "0001_t.sql").write_text("CREATE TABLE t (id int);")
    (tmp_path / "0002_t_id.sql").write_text("-- transactional: false\nCREATE INDEX CONCURRENTLY t_id ON t (id);")
    services = [f"race_{uuid.uuid4().hex[:8]}" for _ in range(12)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        for service in services:
            runs = [pool.submit(postgres.apply_migrations, database_url, service, tmp_path) for _ in range(4)]
            for run in runs:
                run.result()  # raises what the migration raised
    with psycopg.connect(database_url) as conn:
        for service in services:
            assert conn.execute(sql.SQL("SELECT count(*) FROM {}.t").format(sql.Identifier(service))).fetchone() == (0,)
