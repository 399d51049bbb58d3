"""Cross-replica api_calls overshoot: three `serve` processes, 200 concurrent callers, one account.

Each mode starts three real `tollgate serve --target keys,quota,geo` processes on the local test
stack (or TEST_KAFKA_BOOTSTRAP_SERVERS / TEST_DATABASE_URL), signs up one account with an API
key, gives it a plan of 1,000 api_calls with rate limits out of the way, and lets 200 concurrent
callers (spread round-robin over the replicas) call GET /api/geo/projects until refused with
403 insufficient_quota. Once every admitted call is counted, it prints the calls admitted over
the total:
- baseline: per-process admissions (no REDIS_URL: each replica counts only its own);
- shared: the admissions counted in one redis-server (REDIS_URL), services/edge/admissions.py
  (exact: the goal is +0 in every run).

    .venv/bin/python bench/admissions.py [--callers 200]
"""

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench.support import bench_settings, endpoints
from services.runtime.platform.settings import Settings
from tests.integration.test_edge_admissions import UNLIMITED, publish_plan
from tests.integration.test_keys_api import bearer, signup
from tests.support.apps import ServeProcess
from tests.support.redis_server import running_redis

TOTAL = 1000
REPLICAS = 3


async def until(probe, within: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while not await probe():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.1)


async def used_calls(client: httpx.AsyncClient, console: dict[str, str]) -> int:
    report = (await client.get("/api/billing/check-quota", headers=console)).json()
    return int(next(i for i in report["items"] if i["resource"] == "api_calls")["used"])


async def one_mode(settings: Settings, callers: int) -> tuple[int, dict[int, int]]:
    replicas = [ServeProcess(settings, targets="keys,quota,geo") for _ in range(REPLICAS)]
    try:
        for replica in replicas:
            replica.wait_ready(timeout=180)
        pool = httpx.Limits(max_connections=callers)
        clients = [httpx.AsyncClient(base_url=r.base_url, timeout=60, limits=pool) for r in replicas]
        try:
            account, console = await signup(clients[0])
            created = await clients[0].post("/api/api-keys", json={"name": "bench"}, headers=console)
            secret = created.json()["key"]
            await publish_plan(settings, uuid.UUID(account["id"]), TOTAL)
            warm = 0
            for client in clients:  # the key and the plan's limits in force on every replica

                async def ready(c: httpx.AsyncClient = client) -> bool:
                    nonlocal warm
                    r = await c.get("/api/geo/projects", headers=bearer(secret))
                    warm += r.status_code == 200
                    return r.status_code == 200 and r.headers["X-RateLimit-Limit"] == str(UNLIMITED.per_minute)

                await until(ready)
            statuses: dict[int, int] = {}

            async def caller(i: int) -> None:
                client = clients[i % REPLICAS]
                while True:
                    r = await client.get("/api/geo/projects", headers=bearer(secret))
                    statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                    if r.status_code == 403:
                        return

            await asyncio.wait_for(asyncio.gather(*(caller(i) for i in range(callers))), 300)
            admitted = statuses.get(200, 0) + warm

            async def all_counted() -> bool:
                return await used_calls(clients[0], console) >= admitted

            await until(all_counted)
            return await used_calls(clients[0], console) - TOTAL, statuses
        finally:
            for client in clients:
                await client.aclose()
    finally:
        for replica in replicas:
            replica.stop()


async def main(callers: int) -> None:
    with endpoints() as infra, running_redis() as redis_url:
        results = {}
        for mode, redis in (("per-process", None), ("shared", redis_url)):
            async with bench_settings(infra, redis_url=redis) as settings:
                results[mode] = await one_mode(settings, callers)
    print(f"{REPLICAS} serve processes, {callers} concurrent callers, one account with {TOTAL:,} api_calls:")
    for mode, (over, statuses) in results.items():
        print(f"  {mode:12s} admissions: used {TOTAL + over:,} -> {over:+,} calls over the total (statuses {statuses})")
    base, shared = results["per-process"][0], results["shared"][0]
    ratio = shared / base if base else float("nan")
    goal = "goal: +0, exact"
    print(f"overshoot shared vs per-process: {shared:+,} vs {base:+,} calls -> ratio {ratio:.3f} ({goal})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--callers", type=int, default=200)
    asyncio.run(main(parser.parse_args().callers))
