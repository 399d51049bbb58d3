"""Does background work starve request handling in the default `make run` shape? (issue 18, item 4)

`tollgate up` (default `--workers`: every worker runs the routes and its share of every consumer).
Tenant B calls an admitted, metered route (GET /api/geo/projects, a professional plan's key) at a steady
--rate, open loop (a call leaves on schedule whether or not the last one answered), for --seconds:
first with nothing else going on (the baseline), then while a backlog of --events usage events,
written straight to usage.v1, is sunk into ClickHouse and counted by the quota and alerts
consumers of the same processes. Prints both latency distributions, the p99 ratio (goal of
issue 18's isolation figures: within 1.5x), and how long the backlog took to drain (the quota
counter reached its sum).

    .venv/bin/python bench/background.py [--rate 40] [--seconds 20] [--events 200000] [--workers N]
"""

import argparse
import asyncio
import shutil
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka import AIOKafkaProducer

from bench.e2e import tollgate_up
from bench.stats import percentile, summary_ms
from contracts.common import Resource
from contracts.events import UsageEvent
from contracts.topics import USAGE
from tests.support.apps import REPO, free_port
from tests.support.platform import Ingress, new_tenant, quota_used, wait_for


async def steady_calls(http: httpx.AsyncClient, url: str, key: str, rate: float, seconds: float) -> tuple[list[float], int]:
    """Latencies of calls sent every 1/rate s for `seconds`, and how many did not answer 200."""
    latencies: list[float] = []
    failed = 0

    async def one() -> None:
        nonlocal failed
        started = time.perf_counter()
        response = await http.get(url, headers={"Authorization": f"Bearer {key}"})
        latencies.append(time.perf_counter() - started)
        failed += response.status_code != 200

    tasks = []
    start = time.perf_counter()
    for n in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, start + n / rate - time.perf_counter()))
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    return latencies, failed


async def backlog(bootstrap: str, account: uuid.UUID, events: int) -> int:
    """`events` usage events of `account` on usage.v1, as fast as Kafka takes them; their token sum."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    await producer.start()
    total = 0
    try:
        now = datetime.now(UTC)
        for start in range(0, events, 5000):
            batch = []
            for n in range(start, min(events, start + 5000)):
                event = UsageEvent(
                    time=now,
                    account_id=account,
                    resource=Resource.AI_TOKENS,
                    quantity=n % 50 + 1,
                    provider="openai",
                    model="gpt-4o",
                    input_tokens=n % 50 + 1,
                    output_tokens=0,
                    source="bench",
                )
                total += event.quantity
                batch.append(await producer.send(USAGE.name, event.model_dump_json().encode(), key=str(account).encode()))
            await asyncio.gather(*batch)
    finally:
        await producer.stop()
    return total


async def main(rate: float, seconds: float, events: int, workers: int | None) -> None:
    state = REPO / ".tollgate" / f"bench-background-{uuid.uuid4().hex[:6]}"
    port = free_port()
    env, _ = tollgate_up(state, port, *(["--workers", str(workers)] if workers else []))
    base = f"http://127.0.0.1:{port}"
    url = f"{base}/api/geo/projects"
    try:
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=200)) as http:
            ingress = Ingress.single(base)
            b = await new_tenant(http, ingress)  # professional: 100 calls/s, 6,000 a minute
            key, account = b.key, uuid.UUID(b.account_id)
            await asyncio.sleep(20)  # the plan reaches every worker; their consumer groups settle
            quiet, quiet_failed = await steady_calls(http, url, key, rate, seconds)

            async def ai_tokens_used() -> int:
                return (await quota_used(http, ingress, b))[Resource.AI_TOKENS.value]

            used_before = await ai_tokens_used()
            filling = asyncio.create_task(backlog(f"127.0.0.1:{env['TOLLGATE_KAFKA_PORT']}", account, events))
            started = time.monotonic()
            busy, busy_failed = await steady_calls(http, url, key, rate, seconds)
            expected = used_before + await filling
            used = await wait_for(ai_tokens_used, expected, within=600)
            drained = time.monotonic() - started

            shape = f"--workers {workers}" if workers else "default --workers"
            ratio = percentile(busy, 99) / percentile(quiet, 99)
            print(f"`tollgate up` ({shape}), B at {rate:g} calls/s for {seconds:g} s")
            print(f"B alone:                          {summary_ms(quiet)}, not 200: {quiet_failed}")
            print(f"B while {events:,} usage events sink: {summary_ms(busy)}, not 200: {busy_failed}")
            print(
                f"p99 while the backlog sinks vs alone: {percentile(busy, 99) * 1000:.1f} ms vs baseline "
                f"{percentile(quiet, 99) * 1000:.1f} ms -> ratio {ratio:.2f} (goal: within 1.5x)"
            )
            print(f"backlog counted by quota {drained:.1f} s after it started ({used} of {expected} tokens)")
    finally:
        down = [sys.executable, "-m", "services.runtime.host.cli", "down"]
        await asyncio.to_thread(subprocess.run, down, env=env, cwd=REPO, capture_output=True, check=False)
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=40)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    asyncio.run(main(args.rate, args.seconds, args.events, args.workers))
