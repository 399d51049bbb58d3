"""Edge benchmark: what the front door costs, and how fast a toggle is in force elsewhere.

1. Requests/s and latency of `GET /api/geo/projects` (one Postgres read) through the full edge
   (bearer API key -> SHA-256 -> key projection -> roles -> rate limiter -> quota gate ->
   calls.v1 event) vs the same handler with the edge disabled (its dependency's callable swapped
   for one returning a fixed principal), same process, same app, same run, short interleaved
   rounds. Requests are driven straight into the ASGI app (no HTTP client in the way, so the
   edge's share is not diluted). Also prints the median of the per-round ratios.
2. Toggle-to-rejection lag across two `serve` processes: the clock starts when process A's
   toggle response arrives and stops when process B first answers 401 for the key.

Real Kafka and Postgres: the local test stack or TEST_KAFKA_BOOTSTRAP_SERVERS / TEST_DATABASE_URL.

    .venv/bin/python bench/edge.py [--requests 4000] [--rounds 40] [--toggles 60]
"""

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from fastapi import FastAPI, Request
from fastapi.dependencies.models import Dependant
from faststream.kafka import KafkaBroker

from bench.stats import percentile, ratio_line, summary_ms
from bench.support import asgi_status, bench_settings, endpoints
from contracts.common import Resource, Role, Tier
from contracts.events import PlanChanged, QuotaState
from contracts.period import period_of
from contracts.plans import catalogue
from contracts.rate_limit import RateLimit
from contracts.topics import BILLING, QUOTA
from services.edge.principal import Principal
from services.runtime.platform.settings import Settings
from tests.support.apps import ServeProcess, running_app

PATH = "/api/geo/projects"
PASSWORD = "bench-password-123"
# Room enough that the limiter runs its full arithmetic on every call but never says no.
ROOMY = RateLimit(per_second=1_000_000, burst=1_000_000, per_minute=100_000_000)


def edge_dependency(app: FastAPI) -> Dependant:
    """The edge's sub-dependant of the GET route as served. FastAPI 0.165 serves an included
    router's routes through per-inclusion contexts with their own Dependant, so this walks
    `effective_candidates()` where a route has them (`throughput` checks the swap took)."""
    pending: list[Any] = list(app.routes)
    while pending:
        route = pending.pop()
        if hasattr(route, "effective_candidates"):
            pending += route.effective_candidates()
        elif getattr(route, "path", None) == PATH and "GET" in (getattr(route, "methods", None) or ()):
            dependant: Dependant = route.dependant
            return dependant.dependencies[0]
    raise LookupError(PATH)


async def run_block(app: FastAPI, headers: list[tuple[bytes, bytes]], n: int) -> tuple[float, list[float]]:
    samples = []
    started = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        status = await asgi_status(app, "GET", PATH, headers)
        samples.append(time.perf_counter() - t)
        if status != 200:
            raise RuntimeError(f"unexpected status {status}")
    return time.perf_counter() - started, samples


async def publish_plan(settings: Settings, account_id: uuid.UUID) -> None:
    event = PlanChanged(
        time=datetime.now(UTC),
        account_id=account_id,
        plan=Tier.ENTERPRISE,
        quotas=catalogue()[Tier.ENTERPRISE].quotas,
        rate_limit=ROOMY,
    )
    # No quota service runs here: stand in for it with a state that leaves the api_calls quota open.
    quota = QuotaState(
        time=datetime.now(UTC), account_id=account_id, resource=Resource.API_CALLS,
        period=period_of(datetime.now(UTC), settings.tz), total=10**12, used=0, blocked=False,
    )  # fmt: skip
    async with KafkaBroker(settings.kafka_bootstrap_servers) as broker:
        await broker.publish(event.model_dump_json().encode(), settings.topic(BILLING.name), key=str(account_id).encode())
        key = f"{account_id}:{Resource.API_CALLS.value}".encode()
        await broker.publish(quota.model_dump_json().encode(), settings.topic(QUOTA.name), key=key)


async def signup(client: httpx.AsyncClient, settings: Settings) -> tuple[uuid.UUID, dict[str, str]]:
    email = f"bench-{uuid.uuid4().hex[:8]}@example.com"
    body = {"email": email, "password": PASSWORD, "name": "Bench", "user_type": "enterprise"}
    account = (await client.post("/api/auth/register", json=body)).json()
    token = (await client.post("/api/auth/login", json={"email": email, "password": PASSWORD})).json()["access_token"]
    account_id = uuid.UUID(account["id"])
    await publish_plan(settings, account_id)
    return account_id, {"Authorization": f"Bearer {token}"}


async def throughput(settings: Settings, requests: int, rounds: int) -> dict[str, Any]:
    async with running_app(settings, targets=("keys", "geo")) as (app, client):
        edge = app.state.runtime.edge
        account_id, console = await signup(client, settings)
        secret = (await client.post("/api/api-keys", json={"name": "bench"}, headers=console)).json()["key"]
        for _ in range(1000):  # until this edge has seen the plan and the quota state
            if edge.plans.rate_limit(account_id) == ROOMY and edge.quota.get(account_id, Resource.API_CALLS) is not None:
                break
            await asyncio.sleep(0.01)
        headers = [(b"authorization", f"Bearer {secret}".encode()), (b"user-agent", b"bench")]
        dependant = edge_dependency(app)
        edge_call = dependant.call
        principal = Principal(account_id=account_id, roles=frozenset({Role.OWNER}))

        async def fixed(request: Request) -> Principal:  # the edge's signature, none of its work
            return principal

        # "Edge disabled" swaps the dependency's callable in place rather than using
        # app.dependency_overrides: with any override set FastAPI rebuilds every sub-dependant of
        # every request (get_dependant, inspect.signature), which would slow the baseline and
        # flatter the ratio.
        dependant.call = fixed  # the swap must take: only the edge refuses a call without credentials
        swapped = await asgi_status(app, "GET", PATH, [])
        dependant.call = edge_call
        if (swapped, await asgi_status(app, "GET", PATH, [])) != (200, 401):
            raise RuntimeError("swapping the edge dependency had no effect; edge_dependency() found the wrong route")
        result: dict[str, Any] = {"edge_s": 0.0, "bare_s": 0.0, "edge": [], "bare": [], "rounds": []}
        per_block = max(1, requests // rounds)
        try:
            for round_no in range(rounds + 1):  # round 0 warms up both paths
                # Short blocks, order alternating each round, so drift in the machine's load and
                # work spilling from one block into the next fall on both modes alike.
                seconds: dict[str, float] = {}
                for mode in ("edge", "bare") if round_no % 2 else ("bare", "edge"):
                    dependant.call = edge_call if mode == "edge" else fixed
                    elapsed, samples = await run_block(app, headers, per_block if round_no else 200)
                    seconds[mode] = elapsed
                    if round_no:
                        result[f"{mode}_s"] += elapsed
                        result[mode] += samples
                if round_no:
                    result["rounds"].append(seconds["bare"] / seconds["edge"])  # this round's req/s ratio
        finally:
            dependant.call = edge_call
        await asyncio.sleep(0.5)  # let the calls.v1 producer drain before the app stops
        return result


async def toggle_lag(settings: Settings, toggles: int) -> list[float]:
    a, b = ServeProcess(settings, "keys,geo"), ServeProcess(settings, "keys,geo")
    try:
        a.wait_ready()
        b.wait_ready()
        async with httpx.AsyncClient(base_url=a.base_url) as on_a, httpx.AsyncClient(base_url=b.base_url) as on_b:
            _, console = await signup(on_a, settings)
            key = (await on_a.post("/api/api-keys", json={"name": "lag"}, headers=console)).json()
            auth = {"Authorization": f"Bearer {key['key']}"}
            for _ in range(1000):  # until B has the key
                if (await on_b.get(PATH, headers=auth)).status_code == 200:
                    break
                await asyncio.sleep(0.01)
            lags = []
            for _ in range(toggles):
                off = await on_a.post(f"/api/api-keys/{key['id']}/toggle", headers=console)
                started = time.perf_counter()
                assert off.json()["status"] == "disabled"
                while (await on_b.get(PATH, headers=auth)).status_code != 401:
                    pass
                lags.append(time.perf_counter() - started)
                await on_a.post(f"/api/api-keys/{key['id']}/toggle", headers=console)
                while (await on_b.get(PATH, headers=auth)).status_code != 200:
                    pass
            return lags
    finally:
        a.stop()
        b.stop()


async def main(requests: int, rounds: int, toggles: int) -> None:
    with endpoints() as infra:
        async with bench_settings(infra) as settings:
            result = await throughput(settings, requests, rounds)
            lags = await toggle_lag(settings, toggles)
    edge_rps = len(result["edge"]) / result["edge_s"]
    bare_rps = len(result["bare"]) / result["bare_s"]
    edge_ms = [s * 1000 for s in result["edge"]]
    bare_ms = [s * 1000 for s in result["bare"]]
    print(f"GET {PATH} through the full edge:     {edge_rps:,.0f} req/s, {summary_ms(result['edge'])}")
    print(f"GET {PATH} with the edge disabled:    {bare_rps:,.0f} req/s, {summary_ms(result['bare'])}")
    print(ratio_line("requests/s, edge vs no edge (goal >= 0.8)", edge_rps, bare_rps, "req/s"))
    # The same ratio per round (adjacent blocks), its median: a stall of the shared machine moves
    # one round, not the figure.
    print(f"median of the {len(result['rounds'])} rounds' requests/s ratios: {statistics.median(result['rounds']):.3f}")
    print(
        f"added latency: p50 {percentile(edge_ms, 50) - percentile(bare_ms, 50):.3f} ms, "
        f"p99 {percentile(edge_ms, 99) - percentile(bare_ms, 99):.3f} ms (goal p99 <= 2 ms)"
    )
    print(f"toggle-to-rejection lag on another process: {summary_ms(lags)} (goal p99 <= 50 ms)")
    print(ratio_line("toggle lag p99 vs goal", percentile([x * 1000 for x in lags], 99), 50.0, "ms"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--toggles", type=int, default=60)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.rounds, args.toggles))
