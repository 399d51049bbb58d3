"""Quota benchmark: event-to-block latency, and overshoot under 200 concurrent callers.

Runs the quota service in this process (real Kafka, real Postgres: the local test stack or
TEST_KAFKA_BOOTSTRAP_SERVERS / TEST_DATABASE_URL) and prints:
1. event-to-block latency: a usage event that exhausts api_calls is published to usage.v1; the
   clock stops when the edge's projection reports the block. Baseline: the bare Kafka hop (a
   QuotaState published straight to quota.v1 until the projection holds it).
2. overshoot: 200 concurrent callers, each admitted by the gate then publishing its calls.v1
   event (as the edge does), against a limit of 100 remaining calls. A synchronous check would
   admit exactly 100; we print what the gate admits with its local admission count, and with
   the projection alone (no local count) for comparison.

    .venv/bin/python bench/quota.py [--accounts 60]
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

from bench.stats import percentile, ratio_line, summary_ms
from bench.support import bench_settings, endpoints
from contracts.common import Resource
from contracts.events import CallEvent, QuotaState, UsageEvent
from contracts.period import period_of
from contracts.topics import CALLS, QUOTA, USAGE
from services.edge.quota_gate import QuotaProjection
from services.runtime.platform.settings import Settings
from tests.support.apps import running_app

FREE_CALLS = 1000
REMAINING = 100
CALLERS = 200


async def wait_for(predicate, within: float = 10.0) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    while not predicate():
        if time.perf_counter() - started > within:
            raise TimeoutError
        await asyncio.sleep(0.0005)
    return time.perf_counter() - started


async def event_to_block(settings: Settings, gate: QuotaProjection, producer: AIOKafkaProducer, accounts: int) -> list[float]:
    samples = []
    for _ in range(accounts):
        account = uuid.uuid4()
        event = UsageEvent(
            time=datetime.now(UTC), account_id=account, resource=Resource.API_CALLS, quantity=FREE_CALLS, source="bench"
        )
        started = time.perf_counter()
        await producer.send_and_wait(settings.topic(USAGE.name), event.model_dump_json().encode(), key=str(account).encode())
        await wait_for(lambda a=account: (s := gate.get(a, Resource.API_CALLS)) is not None and s.blocked)  # type: ignore[misc]
        samples.append(time.perf_counter() - started)
    return samples


async def bare_hop(settings: Settings, gate: QuotaProjection, producer: AIOKafkaProducer, accounts: int) -> list[float]:
    samples = []
    for _ in range(accounts):
        account = uuid.uuid4()
        now = datetime.now(UTC)
        state = QuotaState(
            time=now,
            account_id=account,
            resource=Resource.API_CALLS,
            period=period_of(now, settings.tz),
            total=1,
            used=1,
            blocked=True,
        )
        started = time.perf_counter()
        await producer.send_and_wait(
            settings.topic(QUOTA.name), state.model_dump_json().encode(), key=f"{account}:api_calls".encode()
        )
        await wait_for(lambda a=account: gate.get(a, Resource.API_CALLS) is not None)  # type: ignore[misc]
        samples.append(time.perf_counter() - started)
    return samples


async def overshoot(settings: Settings, gate: QuotaProjection, producer: AIOKafkaProducer, local_count: bool) -> int:
    account = uuid.uuid4()
    pre = UsageEvent(
        time=datetime.now(UTC), account_id=account, resource=Resource.API_CALLS, quantity=FREE_CALLS - REMAINING, source="bench"
    )
    await producer.send_and_wait(settings.topic(USAGE.name), pre.model_dump_json().encode(), key=str(account).encode())
    await wait_for(lambda: gate.get(account, Resource.API_CALLS) is not None)
    admitted = 0

    def blocked() -> bool:
        now = datetime.now(UTC)
        if local_count:
            return not gate.admit_call(account, now)  # the edge's admission: counts locally
        state = gate.get(account, Resource.API_CALLS)
        return state is not None and state.blocked and state.period == period_of(now, settings.tz)

    async def caller() -> None:
        nonlocal admitted
        while not blocked():
            admitted += 1
            call = CallEvent(
                time=datetime.now(UTC), account_id=account, api_key_id=uuid.uuid4(), method="GET", path="/bench",
                status=200, ip="127.0.0.1", latency_ms=1.0,
            )  # fmt: skip
            await producer.send(settings.topic(CALLS.name), call.model_dump_json().encode(), key=str(account).encode())
            await asyncio.sleep(0.002)  # a handler's worth of work

    await asyncio.wait_for(asyncio.gather(*(caller() for _ in range(CALLERS))), 60)
    return admitted - REMAINING


async def main(accounts: int) -> None:
    with endpoints() as infra:
        async with bench_settings(infra) as settings:
            async with running_app(settings, targets=("quota",)) as (app, _client):
                gate: QuotaProjection = app.state.runtime.edge.quota
                producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all", linger_ms=1)
                await producer.start()
                try:
                    await event_to_block(settings, gate, producer, 5)  # warm up
                    latency = await event_to_block(settings, gate, producer, accounts)
                    hop = await bare_hop(settings, gate, producer, accounts)
                    with_local = await overshoot(settings, gate, producer, local_count=True)
                    projection_only = await overshoot(settings, gate, producer, local_count=False)
                finally:
                    await producer.stop()
    ms = [s * 1000 for s in latency]
    print(f"event-to-block (usage.v1 -> quota -> quota.v1 -> edge): {summary_ms(latency)}")
    print(f"baseline bare Kafka hop (quota.v1 -> edge):            {summary_ms(hop)}")
    print(ratio_line("event-to-block p99 vs goal", percentile(ms, 99), 500.0, "ms"))
    print(ratio_line("event-to-block p50 vs bare hop p50", percentile(ms, 50), percentile([h * 1000 for h in hop], 50), "ms"))
    print(
        f"overshoot, {CALLERS} concurrent callers, {REMAINING} calls left (a synchronous check admits {REMAINING}): "
        f"gate with local count +{with_local}, projection alone +{projection_only}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--accounts", type=int, default=60)
    asyncio.run(main(parser.parse_args().accounts))
