"""GEO overshoot benchmark (issue 15, item 4): stock is exact with several replicas.

Starts P real `tollgate serve --target keys,geo` processes on the local test stack (or
TEST_KAFKA_BOOTSTRAP_SERVERS / TEST_DATABASE_URL) and, for each of R fresh free accounts
(`geo_projects` total 3), fires C concurrent `POST /api/geo/projects` spread over the processes.
Prints:
1. overshoot: projects held above the total (goal 0), summed over the rounds, and the answers;
2. baseline A (the race the lock closes): the same check-then-insert transaction geo runs
   (count live projects, compare to the total, insert) without the per-account lock, C
   concurrent transactions straight on Postgres from this process, same rounds;
3. cost: the rate of the C concurrent creations (mostly 403s, each serialised per account)
   vs the same C concurrent plain list calls on the same processes (ratio), and their p99s.

    .venv/bin/python bench/geo_overshoot.py [--processes 3] [--creators 60] [--rounds 5]
"""

import argparse
import asyncio
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench.stats import percentile, ratio_line
from bench.support import bench_settings, endpoints
from services.runtime.platform.postgres import open_pool
from tests.support.apps import ServeProcess

TOTAL = 3  # the free plan's geo_projects
PASSWORD = "correct horse battery"
GEO = "/api/geo/projects"


async def timed(client: httpx.AsyncClient, method: str, path: str, **kw: object) -> tuple[int, float]:
    started = time.perf_counter()
    response = await client.request(method, path, **kw)  # type: ignore[arg-type]
    return response.status_code, time.perf_counter() - started


async def new_console(clients: list[httpx.AsyncClient]) -> dict[str, str]:
    """A fresh free account, its session known to every process."""
    email = f"b{uuid.uuid4().hex[:10]}@example.com"
    body = {"email": email, "password": PASSWORD, "name": "Bench", "user_type": "individual"}
    assert (await clients[0].post("/api/auth/register", json=body)).status_code == 201
    token = (await clients[0].post("/api/auth/login", json={"email": email, "password": PASSWORD})).json()["access_token"]
    headers = {"Authorization": f"Bearer {token}"}
    deadline = time.monotonic() + 30
    for client in clients:
        while (await client.get(GEO, headers=headers)).status_code != 200:
            assert time.monotonic() < deadline, "a process never learnt the account"
            await asyncio.sleep(0.05)
    return headers


Measured = tuple[int, dict[int, int], list[float], float]


async def with_lock(clients: list[httpx.AsyncClient], creators: int, rounds: int) -> Measured:
    overshoot, answers, latencies, elapsed = 0, {}, [], 0.0
    for _ in range(rounds):
        headers = await new_console(clients)
        started = time.perf_counter()
        results = await asyncio.gather(
            *[timed(clients[n % len(clients)], "POST", GEO, json={"name": f"p{n}"}, headers=headers) for n in range(creators)]
        )
        elapsed += time.perf_counter() - started
        for status, seconds in results:
            answers[status] = answers.get(status, 0) + 1
            latencies.append(seconds)
        held = len((await clients[0].get(GEO, headers=headers)).json()["items"])
        overshoot += max(0, held - TOTAL)
    return overshoot, answers, latencies, elapsed


async def plain_lists(clients: list[httpx.AsyncClient], creators: int, rounds: int) -> tuple[list[float], float]:
    headers = await new_console(clients)
    latencies, elapsed = [], 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        results = await asyncio.gather(*[timed(clients[n % len(clients)], "GET", GEO, headers=headers) for n in range(creators)])
        elapsed += time.perf_counter() - started
        latencies += [s for _, s in results]
    return latencies, elapsed


async def without_lock(database_url: str, creators: int, rounds: int) -> int:
    """Baseline: geo's transaction minus the lock, C at once on one account per round."""
    pool = open_pool(database_url, max_size=min(creators, 40))
    await pool.open(wait=True)
    overshoot = 0
    try:
        for _ in range(rounds):
            account = uuid.uuid4()

            async def create(n: int, account: uuid.UUID = account) -> None:
                async with pool.connection() as conn, conn.transaction():
                    cur = await conn.execute("SELECT count(*) AS n FROM geo.projects WHERE account_id = %s", (account,))
                    row = await cur.fetchone()
                    assert row is not None
                    if row["n"] >= TOTAL:
                        return
                    await conn.execute(
                        "INSERT INTO geo.projects (id, account_id, name, created_at) VALUES (%s, %s, %s, %s)",
                        (uuid.uuid4(), account, f"p{n}", datetime.now(UTC)),
                    )

            await asyncio.gather(*[create(n) for n in range(creators)])
            async with pool.connection() as conn:
                cur = await conn.execute("SELECT count(*) AS n FROM geo.projects WHERE account_id = %s", (account,))
                row = await cur.fetchone()
                assert row is not None
                overshoot += max(0, int(row["n"]) - TOTAL)
    finally:
        await pool.close()
    return overshoot


async def main(processes: int, creators: int, rounds: int) -> None:
    with endpoints() as infra:
        async with bench_settings(infra) as settings:
            procs = [ServeProcess(settings, "keys,geo") for _ in range(processes)]
            try:
                for proc in procs:
                    proc.wait_ready()
                limits = httpx.Limits(max_connections=creators, max_keepalive_connections=creators)
                clients = [httpx.AsyncClient(base_url=p.base_url, timeout=60, limits=limits) for p in procs]
                try:
                    await plain_lists(clients, creators, 1)  # warm up
                    locked = await with_lock(clients, creators, rounds)
                    lists = await plain_lists(clients, creators, rounds)
                finally:
                    for client in clients:
                        await client.aclose()
                unlocked = await without_lock(settings.database_url, creators, rounds)
            finally:
                for proc in procs:
                    proc.stop()
    overshoot, answers, create_s, create_elapsed = locked
    list_s, list_elapsed = lists
    attempts = creators * rounds
    print(f"{processes} serve processes, {creators} concurrent creators per account, {rounds} fresh free accounts")
    print(f"overshoot with geo's per-account lock: {overshoot} projects over in {rounds} rounds (goal 0); answers {answers}")
    print(f"baseline, the same transaction without the lock: {unlocked} projects over in {rounds} rounds")
    print(ratio_line("create rate vs plain list rate", attempts / create_elapsed, attempts / list_elapsed, "req/s"))
    print(
        f"p99 create {percentile([s * 1000 for s in create_s], 99):.1f} ms, "
        f"p99 list {percentile([s * 1000 for s in list_s], 99):.1f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--creators", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.processes, args.creators, args.rounds))
