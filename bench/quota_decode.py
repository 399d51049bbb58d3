"""(issue 38, decision 4) What quota's consumers of usage.v1 and calls.v1 spend per event, with the
msgspec first pass (services/quota/consumers.py: USAGE_READING, CALLS_READING) against pydantic
alone (the same readings without it: the path before), alternating in the same run.

The consumer path of one batch, in this process, as Subscriber.batches runs it: each record read
(decoded, judged by the topic's rules; services/runtime/platform/subscribe.py), then quota's
handler (QuotaService.count on the real Postgres of the test stack, its states to real Kafka).
Not included: aiokafka's fetch and FastStream's batch (the same both ways). Records are as the
producers write them (model_dump_json), 1000 a batch (the subscribers' max_records), new event
ids every round, over 50 accounts (--accounts); usage on several resources, half of it with a key, calls of
the edge. Printed: CPU time of this process per event, decoding alone and the whole path, and
the ratios; and the whole path's elapsed time per batch (Postgres' statements and their round
trips included, which this process's CPU time does not show).

`--key-limits`: every key (`--keys`, 20) has limits of its own in quota (keys.v1's state applied
first: tokens a day, calls a month, publishes a week) and belongs to one account, which its events
name: each batch then publishes every key lineage's standing and moves their marks (the path of
issue 38's key states). Without it the keys are unknown to quota, as before.

    flock /tmp/bench.lock .venv/bin/python bench/quota_decode.py [--batches 10] [--rounds 5] [--accounts 50]
        [--keys 20] [--key-limits]
"""

import argparse
import asyncio
import dataclasses
import gc
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka.structs import ConsumerRecord
from faststream.kafka import KafkaRouter

from bench.stats import ratio_line
from bench.support import bench_settings, endpoints
from contracts.common import Resource, Role
from contracts.events import CallEvent, KeyState, UsageEvent
from contracts.key_limits import KeyLimit, LimitPeriod
from contracts.topics import CALLS, USAGE, Topic
from services.quota import consumers
from services.quota.app import quota_service
from services.quota.service import QuotaService
from services.runtime.platform.subscribe import Reading, Subscriber
from tests.support.apps import running_app

BATCH = 1000
ACCOUNTS = [uuid.uuid4() for _ in range(50)]
KEYS = [uuid.uuid4() for _ in range(20)]
RESOURCES = [Resource.AI_TOKENS, Resource.CONTENT_PUBLISHES, Resource.STORAGE_BYTES]


OWNERS: dict[uuid.UUID, uuid.UUID] = {}  # --key-limits: each key's account


def account_of(i: int, key: uuid.UUID | None) -> uuid.UUID:
    return OWNERS.get(key, ACCOUNTS[i % len(ACCOUNTS)]) if key is not None else ACCOUNTS[i % len(ACCOUNTS)]


def usage(i: int, now: datetime) -> bytes:
    key = KEYS[i % len(KEYS)] if i % 2 else None
    return UsageEvent(
        time=now, account_id=account_of(i, key), resource=RESOURCES[i % 3], quantity=30, source="bench", api_key_id=key,
    ).model_dump_json().encode()  # fmt: skip


def call(i: int, now: datetime) -> bytes:
    key = KEYS[i % len(KEYS)]
    return CallEvent(
        time=now, account_id=account_of(i, key), api_key_id=key, method="GET", path="/api/geo/projects",
        status=200, ip="10.0.0.1", user_agent="bench/1", latency_ms=1.25, service="geo" if i % 2 else None,
    ).model_dump_json().encode()  # fmt: skip


async def limit_keys(service: QuotaService) -> None:
    """Every key with limits of its own, owned by one account (as keys.v1 hands it to quota)."""
    limits = [
        KeyLimit(resource=Resource.AI_TOKENS, amount=1_000_000, period=LimitPeriod.DAY),
        KeyLimit(resource=Resource.API_CALLS, amount=1_000_000, period=LimitPeriod.MONTH),
        KeyLimit(resource=Resource.CONTENT_PUBLISHES, amount=1_000_000, period=LimitPeriod.WEEK),
    ]
    for k, key in enumerate(KEYS):
        OWNERS[key] = ACCOUNTS[k % len(ACCOUNTS)]
        state = KeyState(
            time=datetime.now(UTC), account_id=OWNERS[key], key_id=key, hash="a" * 64, status="enabled", roles=[Role.OWNER],
            limits=limits, version=1,
        )  # fmt: skip
        await service.apply_key(state)


def batch(topic: Topic, n: int) -> list[ConsumerRecord[bytes, bytes]]:
    now = datetime.now(UTC)
    stamp = int(now.timestamp() * 1000)
    event = usage if topic is USAGE else call
    values = [event(i, now) for i in range(n)]
    return [ConsumerRecord(topic.name, 0, i, stamp, 0, b"k", v, None, len(v), -1, []) for i, v in enumerate(values)]


Handle = Callable[[list[Any]], Awaitable[None]]


def paths(service: QuotaService, topic: Topic) -> dict[str, tuple[Reading[Any], Handle]]:
    """The reading and handler quota runs for `topic`, and the same reading without its first pass."""
    reading = consumers.USAGE_READING if topic is USAGE else consumers.CALLS_READING
    handle = consumers.counter(service, topic)
    return {"pydantic": (dataclasses.replace(reading, first_pass=None), handle), "msgspec": (reading, handle)}


async def consume(subscriber: Subscriber, topic: Topic, reading: Reading[Any], handle: Handle | None, records: list[Any]) -> int:
    events = [e for r in records if (e := await subscriber._read(topic, reading, r)) is not None]
    if handle is not None:
        await handle(events)
    return len(events)


async def measure(service: QuotaService, subscriber: Subscriber, topic: Topic, batches: int, rounds: int) -> None:
    modes = paths(service, topic)
    cpu: dict[tuple[str, bool], list[float]] = {(m, whole): [] for m in modes for whole in (False, True)}
    wall: dict[str, list[float]] = {m: [] for m in modes}  # the whole path's elapsed time (Postgres' work included)
    await consume(subscriber, topic, *modes["pydantic"], batch(topic, BATCH))  # warm up
    for _ in range(rounds):
        for whole in (False, True):
            for mode, (reading, handle) in modes.items():  # alternating
                data = [batch(topic, BATCH) for _ in range(batches)]
                gc.collect()
                started, elapsed = time.process_time(), time.perf_counter()
                for records in data:
                    assert await consume(subscriber, topic, reading, handle if whole else None, records) == BATCH
                cpu[mode, whole].append((time.process_time() - started) / (batches * BATCH) * 1e6)
                if whole:
                    wall[mode].append((time.perf_counter() - elapsed) / batches * 1e3)
    for whole, what in ((False, "decode and rules"), (True, "whole path (count included)")):
        for mode in modes:
            runs = " ".join(f"{us:.1f}" for us in cpu[mode, whole])
            print(f"{topic.name} {what:28} {mode:8}: {runs} us/event (median {statistics.median(cpu[mode, whole]):.1f})")
        medians = [statistics.median(cpu[mode, whole]) for mode in ("msgspec", "pydantic")]
        print(ratio_line(f"{topic.name} {what}, msgspec first vs pydantic", *medians, "us/event"))
    for mode in modes:
        runs = " ".join(f"{ms:.1f}" for ms in wall[mode])
        print(f"{topic.name} whole path, elapsed per batch {mode:8}: {runs} ms (median {statistics.median(wall[mode]):.1f})")


async def main(batches: int, rounds: int, accounts: int, keys: int, key_limits: bool) -> None:
    ACCOUNTS[:] = [uuid.uuid4() for _ in range(accounts)]
    KEYS[:] = [uuid.uuid4() for _ in range(keys)]
    with endpoints() as infra:
        async with bench_settings(infra) as settings:
            async with running_app(settings, targets=("quota",)) as (app, _client):
                runtime = app.state.runtime
                service = quota_service(runtime)
                subscriber = Subscriber(KafkaRouter(), runtime.broker, settings)
                if key_limits:
                    await limit_keys(service)
                for topic in (USAGE, CALLS):
                    await measure(service, subscriber, topic, batches, rounds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--accounts", type=int, default=50)
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument("--key-limits", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.batches, args.rounds, args.accounts, args.keys, args.key_limits))
