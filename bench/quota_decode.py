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
the ratios.

    flock /tmp/bench.lock .venv/bin/python bench/quota_decode.py [--batches 10] [--rounds 5]
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
from contracts.common import Resource
from contracts.events import CallEvent, UsageEvent
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


def usage(i: int, now: datetime) -> bytes:
    return UsageEvent(
        time=now, account_id=ACCOUNTS[i % len(ACCOUNTS)], resource=RESOURCES[i % 3], quantity=30, source="bench",
        api_key_id=KEYS[i % 20] if i % 2 else None,
    ).model_dump_json().encode()  # fmt: skip


def call(i: int, now: datetime) -> bytes:
    return CallEvent(
        time=now, account_id=ACCOUNTS[i % len(ACCOUNTS)], api_key_id=KEYS[i % 20], method="GET", path="/api/geo/projects",
        status=200, ip="10.0.0.1", user_agent="bench/1", latency_ms=1.25, service="geo" if i % 2 else None,
    ).model_dump_json().encode()  # fmt: skip


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
    await consume(subscriber, topic, *modes["pydantic"], batch(topic, BATCH))  # warm up
    for _ in range(rounds):
        for whole in (False, True):
            for mode, (reading, handle) in modes.items():  # alternating
                data = [batch(topic, BATCH) for _ in range(batches)]
                gc.collect()
                started = time.process_time()
                for records in data:
                    assert await consume(subscriber, topic, reading, handle if whole else None, records) == BATCH
                cpu[mode, whole].append((time.process_time() - started) / (batches * BATCH) * 1e6)
    for whole, what in ((False, "decode and rules"), (True, "whole path (count included)")):
        for mode in modes:
            runs = " ".join(f"{us:.1f}" for us in cpu[mode, whole])
            print(f"{topic.name} {what:28} {mode:8}: {runs} us/event (median {statistics.median(cpu[mode, whole]):.1f})")
        medians = [statistics.median(cpu[mode, whole]) for mode in ("msgspec", "pydantic")]
        print(ratio_line(f"{topic.name} {what}, msgspec first vs pydantic", *medians, "us/event"))


async def main(batches: int, rounds: int, accounts: int) -> None:
    ACCOUNTS[:] = [uuid.uuid4() for _ in range(accounts)]
    with endpoints() as infra:
        async with bench_settings(infra) as settings:
            async with running_app(settings, targets=("quota",)) as (app, _client):
                runtime = app.state.runtime
                service = quota_service(runtime)
                subscriber = Subscriber(KafkaRouter(), runtime.broker, settings)
                for topic in (USAGE, CALLS):
                    await measure(service, subscriber, topic, batches, rounds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--accounts", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(args.batches, args.rounds, args.accounts))
