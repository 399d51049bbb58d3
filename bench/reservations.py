"""Reservations benchmark: how far 100 concurrent LLM "streams" spend past an ai_tokens total.

Runs the quota service in this process (real Kafka, real Postgres: the local test stack or
TEST_KAFKA_BOOTSTRAP_SERVERS / TEST_DATABASE_URL). One account on the free tier (100,000
ai_tokens); 100 concurrent streams, each in a loop until refused:
- baseline (no reservations): ask the edge's gate (quota.v1 projection) whether ai_tokens is
  blocked, stream for 20-80 ms, report the actual usage on usage.v1 (2,000-5,000 tokens);
- with reservations: reserve 5,000 tokens (QuotaService.reserve, what POST
  /api/quota/reservations calls), stream, report the actual usage with its `reservation_id`;
  a refused stream tries again 20 times, 50 ms apart (settlements free what was held unused).
Afterwards every reported event is counted; printed: tokens over the total in each mode and the
ratio (goal with reservations: 0).

    .venv/bin/python bench/reservations.py [--streams 100]
"""

import argparse
import asyncio
import random
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from aiokafka import AIOKafkaProducer

from bench.support import bench_settings, endpoints
from contracts.common import Resource
from contracts.events import UsageEvent
from contracts.topics import USAGE
from services.edge.quota_gate import QuotaProjection
from services.quota.app import quota_service
from services.quota.domain import InsufficientQuota
from services.quota.service import QuotaService
from services.runtime.platform.settings import Settings
from tests.support.apps import running_app

TOTAL = 100_000  # the free tier's ai_tokens
HOLD = 5_000  # what a stream reserves: its max_tokens


async def report(producer: AIOKafkaProducer, settings: Settings, event: UsageEvent) -> None:
    await producer.send_and_wait(settings.topic(USAGE.name), event.model_dump_json().encode(), key=str(event.account_id).encode())


def usage(account: uuid.UUID, tokens: int, reservation_id: uuid.UUID | None) -> UsageEvent:
    return UsageEvent(
        time=datetime.now(UTC), account_id=account, resource=Resource.AI_TOKENS, quantity=tokens, source="bench",
        reservation_id=reservation_id,
    )  # fmt: skip


async def counted(quota: QuotaService, account: uuid.UUID, expected: int, within: float = 60.0) -> int:
    deadline = time.monotonic() + within
    while True:
        used = next(i.used for i in (await quota.report(account)).items if i.resource is Resource.AI_TOKENS)
        if used >= expected or time.monotonic() > deadline:
            return used
        await asyncio.sleep(0.05)


async def run(
    settings: Settings, quota: QuotaService, gate: QuotaProjection, producer: AIOKafkaProducer, streams: int, reserve: bool
) -> tuple[int, int]:
    """(tokens over the total, streams completed) of one mode, on a fresh account."""
    account = uuid.uuid4()
    rng = random.Random(11)
    reported = completed = 0

    async def stream() -> None:
        nonlocal reported, completed
        refusals = 0
        while True:
            held: uuid.UUID | None = None
            if reserve:
                try:
                    held = (await quota.reserve(account, Resource.AI_TOKENS, HOLD, ttl_seconds=300)).id
                except InsufficientQuota:
                    refusals += 1
                    if refusals > 20:
                        return
                    await asyncio.sleep(0.05)
                    continue
                except psycopg.OperationalError:  # the pool's bounded wait on a loaded machine: retry
                    await asyncio.sleep(0.05)
                    continue
            elif gate.is_blocked(account, Resource.AI_TOKENS, datetime.now(UTC)):
                return
            await asyncio.sleep(rng.uniform(0.02, 0.08))  # the answer streams
            tokens = rng.randint(2_000, HOLD)
            await report(producer, settings, usage(account, tokens, held))
            reported += tokens
            completed += 1

    await asyncio.wait_for(asyncio.gather(*(stream() for _ in range(streams))), 300)
    used = await counted(quota, account, reported)
    return used, completed


async def main(streams: int) -> None:
    with endpoints() as infra:
        async with bench_settings(infra) as settings:
            async with running_app(settings, targets=("quota",)) as (app, _client):
                gate: QuotaProjection = app.state.runtime.edge.quota
                quota = quota_service(app.state.runtime)
                producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all", linger_ms=1)
                await producer.start()
                try:
                    baseline, baseline_done = await run(settings, quota, gate, producer, streams, reserve=False)
                    reserved, reserved_done = await run(settings, quota, gate, producer, streams, reserve=True)
                finally:
                    await producer.stop()
    print(f"{streams} concurrent streams against {TOTAL:,} ai_tokens (each reports 2,000-{HOLD:,} tokens after 20-80 ms):")
    modes = [("baseline, gate only (no reservations)", baseline, baseline_done)]
    modes.append((f"with reservations of {HOLD:,}", reserved, reserved_done))
    for name, used, done in modes:
        print(f"  {name:38s}: used {used:,} -> {max(0, used - TOTAL):+,} tokens over the total ({done} streams completed)")
    over, base_over = max(0, reserved - TOTAL), max(0, baseline - TOTAL)
    ratio = over / base_over if base_over else float("nan")
    print(f"overshoot with reservations vs baseline: {over:,} vs {base_over:,} tokens -> ratio {ratio:.3f} (goal: 0 tokens)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=100)
    asyncio.run(main(parser.parse_args().streams))
