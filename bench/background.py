"""Does background work starve request handling in the default `make run` shape? (issue 18, item 4)

`tollgate up` (default `--workers`: the request workers, and one niced process of consumers).
Tenant B calls an admitted, metered route (GET /api/geo/projects, a professional plan's key) at a steady
--rate, open loop (a call leaves on schedule whether or not the last one answered), for --seconds:
with nothing else going on, before and after (the baseline; both after a warm-up), and while a backlog of --events usage events,
written straight to usage.v1 just before (the consumers start on it at once), is sunk into ClickHouse and counted by the quota and
alerts consumers. Prints both latency distributions, the p99 ratio (goal of issue 18's isolation
figures: within 1.5x), and how long the backlog took to drain (the quota counter reached its sum),
which must outlast B's window for the figure to count.

    .venv/bin/python bench/background.py [--rate 90] [--seconds 20] [--events 400000] [--workers N]

The backlog is written by a process of its own, and all of it before B's second window: B's
client times its calls on its event loop, and 200k events built and sent on that loop would delay
the timing, not the calls (an earlier version did that: BENCHMARKS.md, "background").
"""

import argparse
import asyncio
import multiprocessing
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

WARM_UP_S = 10.0


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


def write_backlog(bootstrap: str, account: uuid.UUID, events: int) -> int:
    """`backlog` in a process of its own (spawned): its token sum."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return int(pool.apply(_backlog_in_process, (bootstrap, account, events)))


def _backlog_in_process(bootstrap: str, account: uuid.UUID, events: int) -> int:
    return asyncio.run(backlog(bootstrap, account, events))


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
            await steady_calls(http, url, key, rate, WARM_UP_S)  # pools grown, code paths warm: not timed
            quiet, quiet_failed = await steady_calls(http, url, key, rate, seconds)

            async def ai_tokens_used() -> int:
                return (await quota_used(http, ingress, b))[Resource.AI_TOKENS.value]

            used_before = await ai_tokens_used()
            started = time.monotonic()
            bootstrap = f"127.0.0.1:{env['TOLLGATE_KAFKA_PORT']}"
            expected = used_before + await asyncio.to_thread(write_backlog, bootstrap, account, events)
            written = time.monotonic() - started
            busy, busy_failed = await steady_calls(http, url, key, rate, seconds)
            window_end = time.monotonic() - started
            still_draining = await ai_tokens_used() < expected
            used = await wait_for(ai_tokens_used, expected, within=600)
            drained = time.monotonic() - started
            after, after_failed = await steady_calls(http, url, key, rate, seconds)
            quiet += after  # the baseline brackets the busy window: one before it, one after

            shape = f"--workers {workers}" if workers else "default --workers"
            ratio = percentile(busy, 99) / percentile(quiet, 99)
            print(f"`tollgate up` ({shape}), B at {rate:g} calls/s for {seconds:g} s")
            print(f"B alone (before and after):       {summary_ms(quiet)}, not 200: {quiet_failed + after_failed}")
            print(f"B while {events:,} usage events sink: {summary_ms(busy)}, not 200: {busy_failed}")
            print(
                f"p99 while the backlog sinks vs alone: {percentile(busy, 99) * 1000:.1f} ms vs baseline "
                f"{percentile(quiet, 99) * 1000:.1f} ms -> ratio {ratio:.2f} (goal: within 1.5x)"
            )
            print(
                f"backlog written in {written:.1f} s; counted by quota {drained:.1f} s after it started "
                f"({used} of {expected} tokens); B's window ended at {window_end:.1f} s"
                + ("" if still_draining else ": VOID, the backlog drained before B's window ended (more --events)")
            )
    finally:
        down = [sys.executable, "-m", "services.runtime.host.cli", "down"]
        await asyncio.to_thread(subprocess.run, down, env=env, cwd=REPO, capture_output=True, check=False)
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=90)  # under B's plan's 100 calls/s
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    asyncio.run(main(args.rate, args.seconds, args.events, args.workers))
