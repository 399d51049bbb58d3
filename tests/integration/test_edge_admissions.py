"""api_calls admissions shared by edge replicas through Redis: the Lua script on a real
redis-server, three real `serve` processes against one account, and Redis unreachable."""

import asyncio
import logging
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from faststream.kafka import KafkaBroker
from redis.asyncio import Redis

from contracts.common import Resource, Tier
from contracts.events import PlanChanged
from contracts.plans import catalogue
from contracts.rate_limit import RateLimit
from contracts.topics import BILLING
from services.edge.admissions import ADMISSION_STORE_ERRORS
from services.edge.leases import LEASE_S
from services.edge.quota_gate import CallsView
from services.edge.rate_limit import Limits
from services.edge.rate_store import RedisStore
from tests.integration.quota_helpers import api_calls_used, eventually
from tests.integration.test_keys_api import bearer, code, new_key, signup
from tests.support.apps import ServeProcess, free_port, running_app

pytestmark = pytest.mark.integration

T0 = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
UNLIMITED = RateLimit(per_second=100_000, burst=100_000, per_minute=10_000_000)
ROOMY = Limits.of(UNLIMITED)


async def publish_plan(settings, account_id: uuid.UUID, api_calls: int) -> None:
    """A plan with these api_calls and rate limits out of the way (the quota is what is measured)."""
    quotas = {**catalogue()[Tier.FREE].quotas, Resource.API_CALLS: api_calls}
    event = PlanChanged(time=datetime.now(UTC), account_id=account_id, plan=Tier.FREE, quotas=quotas, rate_limit=UNLIMITED)
    async with KafkaBroker(settings.kafka_bootstrap_servers) as broker:
        await broker.publish(event.model_dump_json().encode(), settings.topic(BILLING.name), key=str(account_id).encode())


async def account_on_plan(app, client: httpx.AsyncClient, settings, api_calls: int) -> tuple[uuid.UUID, dict[str, str], str]:
    """A new account (its id, its console's headers) and its API key, on a plan of `api_calls`,
    once this app's edge applies the plan and its quota state."""
    account, console = await signup(client)
    secret = (await new_key(client, console))["key"]
    account_id = uuid.UUID(account["id"])
    await publish_plan(settings, account_id, api_calls)
    edge = app.state.runtime.edge

    async def applied() -> bool:
        state = edge.quota.get(account_id, Resource.API_CALLS)
        return state is not None and state.total == api_calls and edge.plans.rate_limit(account_id) == UNLIMITED

    await eventually(applied)
    return account_id, console, secret


async def test_replicas_share_one_exact_count_whatever_order_quota_counts_the_calls_in(redis_url):
    """The admission half of the edge's Redis script, two replicas' stores on one redis-server."""
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    a, b = RedisStore(redis_url, prefix, prefix), RedisStore(redis_url, prefix, prefix)
    account = uuid.uuid4()
    now = T0.timestamp()

    async def admit(store: RedisStore, view: CallsView) -> bool | None:
        decision, admitted = await store.hit_and_admit((f"a:{account}", "k:1"), ROOMY, now, view)
        assert decision.allowed
        return admitted

    fresh = CallsView(account, "2026-03", None, 0, 0, 5)  # no state yet: free tier of 5
    try:
        admitted = [await admit(a, fresh) for _ in range(3)] + [await admit(b, fresh) for _ in range(3)]
        assert admitted == [True] * 5 + [False]  # 5 between the two replicas, not 5 each
        # Quota counted b's later calls before a's earlier ones (a slower handler): a state with
        # the latest watermark but 2 used. The 3 calls still in flight keep their places.
        later_first = CallsView(account, "2026-03", T0 + timedelta(minutes=5), 2, 0, 5)
        assert await admit(a, later_first) is False
        assert await a.admitted(later_first) == 5
        # Replica b lags (no state yet): it is judged with the newest state Redis keeps, not its own.
        assert await admit(b, fresh) is False
        # A call refused by its handler after admission gives its place back: given again, once.
        await a.release(later_first)
        assert [await admit(b, fresh) for _ in range(2)] == [True, False]
        # An upgrade (same watermark, bigger total) and a reservation (reserved) count at once.
        bigger = CallsView(account, "2026-03", T0 + timedelta(minutes=5), 2, 4, 10)
        assert [await admit(b, bigger) for _ in range(2)] == [True, False]  # 5 + 1 admitted, 4 reserved
        # Calls quota counted that never passed here (Redis was away) take their places too.
        beyond = CallsView(account, "2026-03", T0 + timedelta(minutes=6), 9, 0, 10)
        assert [await admit(a, beyond) for _ in range(2)] == [True, False]
        assert await a.admitted(beyond) == 10
        # Another period is a fresh count.
        april = CallsView(account, "2026-04", None, 0, 0, 1)
        assert [await admit(a, april) for _ in range(2)] == [True, False]
        # A call the rate limit refuses is not admitted (nor judged): its place stays free.
        strict = Limits(per_second=1, burst=1, per_minute=100)
        may = CallsView(account, "2026-05", None, 0, 0, 5)
        decisions = [await a.hit_and_admit((f"a:{account}", "k:2"), strict, now, may) for _ in range(2)]
        assert [(d.allowed, admitted) for d, admitted in decisions] == [(True, True), (False, None)]
        assert await a.admitted(may) == 1
    finally:
        await a.close()
        await b.close()


async def test_an_admitted_call_costs_one_redis_round_trip(settings, redis_url):
    """The rate limit and the api_calls admission of an API-key call are one script on Redis."""
    shared = settings.model_copy(update={"redis_url": redis_url})
    redis = Redis.from_url(redis_url)
    async with running_app(shared) as (app, client):
        _, _, secret = await account_on_plan(app, client, settings, 50)
        assert (await client.get("/api/geo/projects", headers=bearer(secret))).status_code == 200  # script loaded
        before = await redis.info("commandstats")
        statuses = [(await client.get("/api/geo/projects", headers=bearer(secret))).status_code for _ in range(10)]
        after = await redis.info("commandstats")
        assert statuses == [200] * 10
        calls = {name: after[name]["calls"] - before.get(name, {"calls": 0})["calls"] for name in after}
        assert calls["cmdstat_evalsha"] == 10  # one script per call (it was two: the limit, then the admission)
        # the rest ran inside that script (get: whether the key was revoked since this replica's state;
        # hget: whether the key's user was removed or re-roled since: docs/architecture.md, strict ends)
        script_commands = {"cmdstat_hmget", "cmdstat_hset", "cmdstat_expire", "cmdstat_info", "cmdstat_evalsha"}
        script_commands |= {"cmdstat_get", "cmdstat_hget"}
        assert {name for name, n in calls.items() if n} <= script_commands, calls
    await redis.aclose()


@pytest.mark.parametrize("admissions", ["shared", "in-process"])
async def test_an_admitted_call_its_handler_refuses_gives_its_place_back(settings, redis_url, admissions):
    """Six concurrent project creations pass the edge (one admission each); geo refuses three of
    them (403 insufficient_quota, its 3 projects) after admission. Quota counts only the three
    created, and the three refused calls' places are given again: the account's 8 api_calls are
    all usable, with the admissions in Redis or in this one process."""
    shared = settings.model_copy(update={"redis_url": redis_url if admissions == "shared" else None})
    async with running_app(shared) as (app, client):
        account_id, console, secret = await account_on_plan(app, client, settings, 8)
        creations = await asyncio.gather(
            *(client.post("/api/geo/projects", json={"name": f"p{i}"}, headers=bearer(secret)) for i in range(6))
        )
        assert sorted(r.status_code for r in creations) == [201] * 3 + [403] * 3
        assert {code(r) for r in creations if r.status_code == 403} == {"insufficient_quota"}
        edge = app.state.runtime.edge
        if edge.shared is not None:
            # The refused calls' places go back in the background, and a lease's leftovers (the six
            # concurrent calls may take a block) when it expires unused, within LEASE_S: the count
            # settles at the 3 created, or the test fails here.
            async def settled() -> bool:
                return await edge.shared.admitted(edge.quota.calls_view(account_id, datetime.now(UTC))) == 3

            await eventually(settled, within=LEASE_S + 5)
        reads = [(await client.get("/api/geo/projects", headers=bearer(secret))).status_code for _ in range(6)]
        assert reads == [200] * 5 + [403]  # 3 created + 5 read = the 8 api_calls, exactly
        await eventually(lambda: _equals(lambda: api_calls_used(client, console), 8))


async def test_three_serve_processes_share_api_calls_within_the_documented_bound(settings, redis_url):
    """200 concurrent callers of one account spread over three replicas: together they are
    admitted exactly the total, and quota counts exactly that (docs/quota.md)."""
    shared = settings.model_copy(update={"redis_url": redis_url})
    total = 1000
    # Without metering: the embedded ClickHouse engine (chdb) admits one process per path.
    replicas = [ServeProcess(shared, targets="keys,quota,geo") for _ in range(3)]
    try:
        for replica in replicas:
            replica.wait_ready(timeout=120)
        async with httpx.AsyncClient(base_url=replicas[0].base_url, timeout=30) as first:
            account, console = await signup(first)
            secret = (await new_key(first, console))["key"]
            account_id = uuid.UUID(account["id"])
            await publish_plan(settings, account_id, total)
            pool = httpx.Limits(max_connections=100)
            clients = [httpx.AsyncClient(base_url=r.base_url, timeout=30, limits=pool) for r in replicas]
            try:
                for client in clients:  # every replica knows the key and the plan's rate limits

                    async def ready(c: httpx.AsyncClient = client) -> bool:
                        r = await c.get("/api/billing/check-quota", headers=console)
                        calls = next(i for i in r.json()["items"] if i["resource"] == "api_calls")
                        return r.status_code == 200 and calls["total"] == total

                    await eventually(ready, within=30)
                statuses: dict[int, int] = {}
                for client in clients:

                    async def known(c: httpx.AsyncClient = client) -> bool:
                        r = await c.get("/api/geo/projects", headers=bearer(secret))
                        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1  # admitted: counted too
                        return r.status_code == 200 and r.headers["X-RateLimit-Limit"] == str(UNLIMITED.burst)

                    await eventually(known, within=30)

                async def caller(i: int) -> None:
                    client = clients[i % 3]
                    while True:
                        r = await client.get("/api/geo/projects", headers=bearer(secret))
                        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                        if r.status_code == 403:
                            assert code(r) == "insufficient_quota"
                            return

                await asyncio.wait_for(asyncio.gather(*(caller(i) for i in range(200))), 180)
                assert set(statuses) <= {200, 403}, statuses
                # The three replicas admitted exactly the total (warm-up calls included), and quota
                # counted every one of them.
                assert statuses[200] == total, statuses
                await eventually(lambda: _equals(lambda: api_calls_used(clients[0], console), total), within=60)
            finally:
                for client in clients:
                    await client.aclose()
    finally:
        for replica in replicas:
            replica.stop()


async def _equals(probe, expected: int) -> bool:
    return bool(await probe() == expected)


async def test_redis_unreachable_fails_open_to_the_process_count_loudly(settings, caplog):
    """Declared behaviour: the call is judged by this process's own count (one process keeps its
    exact limit), with a warning in the log and tollgate_edge_admission_store_errors_total."""
    down = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_port()}/0"})  # nothing listens
    async with running_app(down) as (app, client):
        _, _, secret = await account_on_plan(app, client, settings, 5)
        errors_before = ADMISSION_STORE_ERRORS._value.get()
        with caplog.at_level(logging.WARNING, logger="services.edge.edge"):
            statuses = [(await client.get("/api/geo/projects", headers=bearer(secret))).status_code for _ in range(7)]
        assert statuses == [200] * 5 + [403, 403]
        assert ADMISSION_STORE_ERRORS._value.get() - errors_before == 7
        assert any("shared api_calls admissions unavailable" in r.getMessage() for r in caplog.records)
