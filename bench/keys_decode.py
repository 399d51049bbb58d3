"""(issue 38, decision 4) What the keys service's consumer of calls.v1 (each key's last_used_at)
spends per call, with the msgspec first pass (services/keys/consumers.py: CALLS_READING) against
pydantic alone (the same reading without it: the path before), alternating in the same run.

The consumer path of one batch, in this process, as Subscriber.batches runs it: each record read
(decoded, judged by calls.v1's time rule; services/runtime/platform/subscribe.py), then the keys
service's handler (last_used and KeysService.note_calls: one UPDATE on the real Postgres of the
test stack). Not included: aiokafka's fetch and FastStream's batch (the same both ways). Records
are calls as the edge writes them (model_dump_json), 1000 a batch (--batch), new event ids every
round, over --keys keys of one account (made first, so the UPDATE moves real rows); every 10th
call refused (error_code: no use). Printed: CPU time of this process per call, decoding alone and
the whole path, and the ratios.

    flock /tmp/bench.lock .venv/bin/python bench/keys_decode.py [--batches 10] [--rounds 5] [--batch 1000] [--keys 200]
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
from contracts.audit import AuditContext
from contracts.common import UserType
from contracts.events import CallEvent
from contracts.keys_api import RegisterRequest
from contracts.topics import CALLS
from services.keys import consumers
from services.keys.delivery import EdgeDelivery
from services.keys.service import KeysService
from services.keys.store import KeysStore
from services.runtime.platform.outbox_relay import OutboxRelay
from services.runtime.platform.subscribe import Reading, Subscriber
from tests.support.apps import running_app

ACCOUNT: list[uuid.UUID] = []  # the keys' account (made first)
KEYS: list[uuid.UUID] = []


def call(i: int, now: datetime) -> bytes:
    refused = {"status": 429, "error_code": "rate_limited"} if i % 10 == 9 else {"status": 200}
    return CallEvent(
        time=now, account_id=ACCOUNT[0], api_key_id=KEYS[i % len(KEYS)], method="GET", path="/api/geo/projects",
        ip="10.0.0.1", user_agent="bench/1", latency_ms=1.25, service="geo" if i % 2 else None, **refused,
    ).model_dump_json().encode()  # fmt: skip


def batch(n: int) -> list[ConsumerRecord[bytes, bytes]]:
    now = datetime.now(UTC)
    stamp = int(now.timestamp() * 1000)
    values = [call(i, now) for i in range(n)]
    return [ConsumerRecord(CALLS.name, 0, i, stamp, 0, b"k", v, None, len(v), -1, []) for i, v in enumerate(values)]


Handle = Callable[[list[Any]], Awaitable[None]]


async def consume(subscriber: Subscriber, reading: Reading[Any], handle: Handle | None, records: list[Any]) -> int:
    events = [e for r in records if (e := await subscriber._read(CALLS, reading, r)) is not None]
    if handle is not None:
        await handle(events)
    return len(events)


async def measure(service: KeysService, subscriber: Subscriber, size: int, batches: int, rounds: int) -> None:
    handle = consumers.noting_calls(service, every_s=0)  # the pause between batches is no work
    modes = {
        "pydantic": dataclasses.replace(consumers.CALLS_READING, first_pass=None),
        "msgspec": consumers.CALLS_READING,
    }
    cpu: dict[tuple[str, bool], list[float]] = {(m, whole): [] for m in modes for whole in (False, True)}
    await consume(subscriber, modes["pydantic"], handle, batch(size))  # warm up
    for _ in range(rounds):
        for whole in (False, True):
            for mode, reading in modes.items():  # alternating
                data = [batch(size) for _ in range(batches)]
                gc.collect()
                started = time.process_time()
                for records in data:
                    assert await consume(subscriber, reading, handle if whole else None, records) == size
                cpu[mode, whole].append((time.process_time() - started) / (batches * size) * 1e6)
    for whole, what in ((False, "decode and rules"), (True, "whole path (UPDATE included)")):
        for mode in modes:
            runs = " ".join(f"{us:.1f}" for us in cpu[mode, whole])
            print(f"calls.v1 {what:29} {mode:8}: {runs} us/call (median {statistics.median(cpu[mode, whole]):.1f})")
        new, old = (statistics.median(cpu[mode, whole]) for mode in ("msgspec", "pydantic"))
        print(ratio_line(f"calls.v1 {what}, msgspec first vs pydantic", new, old, "us/call"))


async def main(batches: int, rounds: int, size: int, keys: int) -> None:
    with endpoints() as infra:
        async with bench_settings(infra) as settings:
            async with running_app(settings, targets=("keys",)) as (app, _client):
                runtime = app.state.runtime
                relay = OutboxRelay(runtime.pool, settings, "keys")  # the setup's writes wait for its acks
                await relay.start()
                service = KeysService(
                    KeysStore(runtime.pool, relay),
                    EdgeDelivery(relay, runtime.edge, runtime.clock),
                    runtime.clock,
                    session_ttl_seconds=settings.session_ttl_seconds,
                )
                request = RegisterRequest(
                    email="bench@example.com", password="bench-password", name="Bench", user_type=UserType.INDIVIDUAL
                )
                ACCOUNT.append((await service.register(request))["id"])
                for k in range(keys):
                    row, _ = await service.create_key(
                        ACCOUNT[0], ACCOUNT[0], f"bench {k}", None, audit=AuditContext(operator=True)
                    )
                    KEYS.append(row["id"])
                subscriber = Subscriber(KafkaRouter(), runtime.broker, settings)
                await relay.stop()
                print(f"{batches} batches of {size} calls a round, {rounds} rounds, {keys} keys")
                await measure(service, subscriber, size, batches, rounds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(main(args.batches, args.rounds, args.batch, args.keys))
