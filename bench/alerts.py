"""Alerts benchmark: crossing-to-in-site-notification latency.

Runs the alerts service in this process (real Kafka, real Postgres: the local test stack or
TEST_KAFKA_BOOTSTRAP_SERVERS / TEST_DATABASE_URL). Each sample is one fresh account with an 80%
in-site rule; the clock starts when a quota-thresholds.v1 event (95%) is published and stops when
the notification row is visible in alerts.notifications (what GET /api/notifications reads).
That path is: Kafka -> consumer -> firing + deliveries committed -> dispatcher locks, stores the
notification, marks the delivery sent. Baseline, same run: the bare hop of the same plumbing
(a quota.v1 state published until the alerts consumer has stored it in alerts.quota_states).

    .venv/bin/python bench/alerts.py [--accounts 60]
"""

import argparse
import asyncio
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka import AIOKafkaProducer
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from bench.stats import percentile, ratio_line, summary_ms
from bench.support import bench_settings, endpoints
from contracts.alerts_api import Channel
from contracts.common import AlertMetric, Resource
from contracts.events import QuotaState, QuotaThresholdCrossed
from contracts.period import period_of
from contracts.topics import QUOTA, QUOTA_THRESHOLDS
from services.alerts import store
from services.runtime.platform.settings import Settings
from tests.support.apps import running_app

GOAL_P99_MS = 1000.0


async def wait_for_row(conn: AsyncConnection, sql: str, account: uuid.UUID, within: float = 10.0) -> None:
    deadline = time.perf_counter() + within
    while True:
        cur = await conn.execute(sql, (account,))  # type: ignore[arg-type]
        if await cur.fetchone() is not None:
            return
        if time.perf_counter() > deadline:
            raise TimeoutError(sql)
        await asyncio.sleep(0.002)


async def crossing_to_notification(settings: Settings, producer: AIOKafkaProducer, conn: AsyncConnection, n: int) -> list[float]:
    period = period_of(datetime.now(UTC), settings.tz)
    accounts = [uuid.uuid4() for _ in range(n)]
    for account in accounts:
        await store.insert_rule(conn, account, AlertMetric.TOTAL_TOKENS, 80, [Channel.IN_SITE], [], datetime.now(UTC))
    samples = []
    for account in accounts:
        event = QuotaThresholdCrossed(
            time=datetime.now(UTC), account_id=account, resource=Resource.AI_TOKENS, period=period,
            threshold_pct=95, used=95_000, total=100_000,
        )  # fmt: skip
        started = time.perf_counter()
        await producer.send_and_wait(
            settings.topic(QUOTA_THRESHOLDS.name), event.model_dump_json().encode(), key=str(account).encode()
        )
        await wait_for_row(conn, "SELECT 1 FROM alerts.notifications WHERE account_id = %s", account)
        samples.append(time.perf_counter() - started)
    return samples


async def bare_hop(settings: Settings, producer: AIOKafkaProducer, conn: AsyncConnection, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        account = uuid.uuid4()
        now = datetime.now(UTC)
        state = QuotaState(
            time=now, account_id=account, resource=Resource.AI_TOKENS, period=period_of(now, settings.tz),
            total=100_000, used=1, blocked=False,
        )  # fmt: skip
        started = time.perf_counter()
        await producer.send_and_wait(
            settings.topic(QUOTA.name), state.model_dump_json().encode(), key=f"{account}:ai_tokens".encode()
        )
        await wait_for_row(conn, "SELECT 1 FROM alerts.quota_states WHERE account_id = %s", account)
        samples.append(time.perf_counter() - started)
    return samples


async def main(accounts: int) -> None:
    with endpoints() as infra:
        async with bench_settings(infra) as settings:
            async with running_app(settings, targets=("alerts",)):
                producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all", linger_ms=1)
                await producer.start()
                conn = await AsyncConnection.connect(settings.database_url, autocommit=True, row_factory=dict_row)
                try:
                    await crossing_to_notification(settings, producer, conn, 5)  # warm up
                    latency = await crossing_to_notification(settings, producer, conn, accounts)
                    hop = await bare_hop(settings, producer, conn, accounts)
                finally:
                    await conn.close()
                    await producer.stop()
    ms = [s * 1000 for s in latency]
    print(f"crossing-to-in-site notification (quota-thresholds.v1 -> alerts -> notification): {summary_ms(latency)}")
    print(f"baseline bare hop (quota.v1 -> alerts consumer -> Postgres row):                  {summary_ms(hop)}")
    print(ratio_line("crossing-to-notification p99 vs goal", percentile(ms, 99), GOAL_P99_MS, "ms"))
    print(
        ratio_line(
            "crossing-to-notification p50 vs bare hop p50", percentile(ms, 50), percentile([h * 1000 for h in hop], 50), "ms"
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--accounts", type=int, default=60)
    asyncio.run(main(parser.parse_args().accounts))
