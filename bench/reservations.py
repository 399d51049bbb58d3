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

(v4) `--key-limit`: a key's own limit instead of the gate-only baseline. The account's run with
reservations (as above) is the baseline; then one key of a fresh account gets a limit of 50,000
ai_tokens a month (keys.v1, as the keys service publishes it), narrower than the account's
100,000, and the streams reserve and report with the key's `api_key_id`: printed, the key's
tokens over its limit (goal: 0) next to the account's over its total.

    .venv/bin/python bench/reservations.py [--streams 100]
    .venv/bin/python bench/reservations.py --key-limit --streams 50
"""

import argparse
import asyncio
import random
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from aiokafka import AIOKafkaProducer

from bench.support import bench_settings, endpoints
from contracts.common import KeyStatus, Resource, Role
from contracts.domain_errors import NotFound
from contracts.events import KeyState, UsageEvent
from contracts.key_limits import KeyLimit, LimitPeriod
from contracts.topics import KEYS, USAGE
from services.edge import Edge
from services.edge.quota_gate import QuotaProjection
from services.quota.app import quota_service
from services.quota.domain import InsufficientQuota, KeyLimitExhausted
from services.quota.service import QuotaService
from services.runtime.platform.settings import Settings
from tests.support.apps import running_app

TOTAL = 100_000  # the free tier's ai_tokens
HOLD = 5_000  # what a stream reserves: its max_tokens
KEY_LIMIT = KeyLimit(resource=Resource.AI_TOKENS, amount=50_000, period=LimitPeriod.MONTH)  # (v4) narrower than TOTAL


async def report(producer: AIOKafkaProducer, settings: Settings, event: UsageEvent) -> None:
    await producer.send_and_wait(settings.topic(USAGE.name), event.model_dump_json().encode(), key=str(event.account_id).encode())


def usage(account: uuid.UUID, tokens: int, reservation_id: uuid.UUID | None, key: uuid.UUID | None = None) -> UsageEvent:
    return UsageEvent(
        time=datetime.now(UTC), account_id=account, resource=Resource.AI_TOKENS, quantity=tokens, source="bench",
        reservation_id=reservation_id, api_key_id=key,
    )  # fmt: skip


async def account_used(quota: QuotaService, account: uuid.UUID) -> int:
    return next(i.used for i in (await quota.report(account)).items if i.resource is Resource.AI_TOKENS)


async def counted(used_now: Callable[[], Awaitable[int]], expected: int, within: float = 60.0) -> int:
    deadline = time.monotonic() + within
    while True:
        used = await used_now()
        if used >= expected or time.monotonic() > deadline:
            return used
        await asyncio.sleep(0.05)


async def limited_key(settings: Settings, quota: QuotaService, producer: AIOKafkaProducer, account: uuid.UUID) -> uuid.UUID:
    """(v4) A key of `account` with KEY_LIMIT, on keys.v1 as the keys service publishes it; returns
    once quota judges reservations by the limit (one past it refused by the key)."""
    key = uuid.uuid4()
    state = KeyState(
        time=datetime.now(UTC), account_id=account, key_id=key, hash=uuid.uuid4().hex * 2, status=KeyStatus.ENABLED,
        roles=[Role.OWNER], limits=[KEY_LIMIT], version=1,
    )  # fmt: skip
    await producer.send_and_wait(settings.topic(KEYS.name), state.model_dump_json().encode(), key=str(key).encode())
    while True:
        try:
            held = await quota.reserve(account, Resource.AI_TOKENS, KEY_LIMIT.amount + 1, 60, api_key_id=key)
        except KeyLimitExhausted:
            return key
        except NotFound:
            continue  # quota has not heard of the key yet (it waited for it a moment)
        await quota.release(held.id)  # judged before quota knew the limit: hold nothing
        await asyncio.sleep(0.05)


async def run(
    settings: Settings,
    quota: QuotaService,
    gate: QuotaProjection,
    producer: AIOKafkaProducer,
    streams: int,
    reserve: bool,
    key_edge: Edge | None = None,
) -> tuple[int, int]:
    """(tokens used, streams completed) of one mode, on a fresh account. With `key_edge` (v4) the
    streams reserve and report for one key limited by KEY_LIMIT, and the key's usage in its window
    is what is returned (read from that edge's copy of quota's key standings)."""
    account = uuid.uuid4()
    key = None if key_edge is None else await limited_key(settings, quota, producer, account)
    rng = random.Random(11)
    reported = completed = 0

    async def stream() -> None:
        nonlocal reported, completed
        refusals = 0
        while True:
            held: uuid.UUID | None = None
            if reserve:
                try:
                    held = (await quota.reserve(account, Resource.AI_TOKENS, HOLD, ttl_seconds=300, api_key_id=key)).id
                except (InsufficientQuota, KeyLimitExhausted):
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
            await report(producer, settings, usage(account, tokens, held, key))
            reported += tokens
            completed += 1

    await asyncio.wait_for(asyncio.gather(*(stream() for _ in range(streams))), 300)
    if key is None or key_edge is None:
        return await counted(lambda: account_used(quota, account), reported), completed

    async def key_used() -> int:
        return key_edge.key_quota.standing(key, KEY_LIMIT, datetime.now(UTC)).used

    return await counted(key_used, reported), completed


async def main(streams: int, key_limit: bool) -> None:
    with endpoints() as infra:
        async with bench_settings(infra) as settings:
            async with running_app(settings, targets=("quota",)) as (app, _client):
                edge: Edge = app.state.runtime.edge
                quota = quota_service(app.state.runtime)
                producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all", linger_ms=1)
                await producer.start()
                try:
                    if key_limit:  # (v4) the account's run with reservations is the key's baseline
                        baseline, baseline_done = await run(settings, quota, edge.quota, producer, streams, reserve=True)
                        keyed, keyed_done = await run(settings, quota, edge.quota, producer, streams, True, key_edge=edge)
                    else:
                        baseline, baseline_done = await run(settings, quota, edge.quota, producer, streams, reserve=False)
                        reserved, reserved_done = await run(settings, quota, edge.quota, producer, streams, reserve=True)
                finally:
                    await producer.stop()
    if key_limit:
        limit = KEY_LIMIT.amount
        print(f"{streams} concurrent reserve-then-settle streams of {HOLD:,} (each reports 2,000-{HOLD:,} tokens):")
        print(f"  account's total {TOTAL:,} (baseline): used {baseline:,} -> {baseline - TOTAL:+,} ({baseline_done} streams)")
        print(f"  key's limit {limit:,} a month     : used {keyed:,} -> {keyed - limit:+,} ({keyed_done} streams)")
        print(f"key limit overshoot: {max(0, keyed - limit):,} tokens (goal: 0); the account's: {max(0, baseline - TOTAL):,}")
        return
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
    parser.add_argument("--key-limit", action="store_true", help="(v4) a key's own limit, the account's run as baseline")
    args = parser.parse_args()
    asyncio.run(main(args.streams, args.key_limit))
