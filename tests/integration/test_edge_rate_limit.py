"""Rate limits through the real edge (in process and on a real redis-server) and calls.v1 events."""

import asyncio
import math
import random
import time
import uuid
from datetime import UTC, datetime

import pytest
from aiokafka import AIOKafkaConsumer
from faststream.kafka import KafkaBroker
from redis.asyncio import Redis

from contracts.common import Tier
from contracts.events import CallEvent, PlanChanged
from contracts.plans import catalogue
from contracts.rate_limit import RateLimit
from contracts.topics import BILLING, CALLS
from services.edge.rate_limit import Decision, Limits
from services.edge.rate_store import KeyCheck, KeyRevoked, MemoryStore, RedisStore
from tests.integration.test_keys_api import bearer, code, new_key, signup
from tests.support.apps import running_app

pytestmark = pytest.mark.integration


async def test_redis_store_decides_exactly_like_the_in_process_store(redis_url):
    rng = random.Random(7)
    memory, shared = MemoryStore(), RedisStore(redis_url, prefix=f"t{uuid.uuid4().hex[:8]}:")
    limits = Limits(per_second=3.7, burst=5, per_minute=40)
    now = 1_800_000_017.25
    try:
        for _ in range(600):
            now += rng.choice([0.0, 0.0, 0.01, 0.13, 0.4, 2.5, 31.0])
            subjects = ("acct", rng.choice(["k1", "k2", "k3"]))
            peek = memory.refused(subjects, limits, now)  # the screen's question: takes nothing
            # (v4) a key-rule refusal's headers: the same read on both stores, taking nothing
            peeked = await memory.peek(subjects, limits, now)
            assert peeked == await shared.peek(subjects, limits, now)
            decision = await memory.hit(subjects, limits, now)
            assert decision == await shared.hit(subjects, limits, now)
            assert peek == (None if decision.allowed else decision)
            assert peeked.allowed == decision.allowed
    finally:
        await shared.close()


class RoundTrips:
    """Counts a RedisStore's round trips to Redis (each runs its one Lua script)."""

    def __init__(self, store: RedisStore) -> None:
        self.count = 0
        script = store._script

        async def counted(**kwargs):  # type: ignore[no-untyped-def]
            self.count += 1
            return await script(**kwargs)

        store._script = counted  # type: ignore[assignment]


async def test_redis_store_refuses_a_flood_from_its_copy_and_asks_redis_again_in_time(redis_url):
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    store, other_replica = RedisStore(redis_url, prefix=prefix), RedisStore(redis_url, prefix=prefix)
    trips = RoundTrips(store)
    limits = Limits(per_second=1.0, burst=2, per_minute=100)
    subjects, now = ("acct", "key"), 1_800_000_000.0
    try:
        assert [(await store.hit(subjects, limits, now)).allowed for _ in range(2)] == [True, True]
        flood = [await store.hit(subjects, limits, now + 0.1 * i) for i in range(10)]  # the bucket refills 1/s
        assert not any(d.allowed for d in flood)
        assert [d.retry_after_s for d in flood] == [1] * 10
        assert trips.count == 2  # the second took the last token: the flood is refused from the copy
        # The screen's question, answered from the copy alike (and no answer once it would admit).
        assert store.refused(subjects, limits, now + 0.95) == flood[-1]
        assert store.refused(subjects, limits, now + 1.0) is None and trips.count == 2
        # At 1 s the copy would admit, so Redis decides: another replica took the token meanwhile.
        assert (await other_replica.hit(subjects, limits, now + 1.0)).allowed
        assert not (await store.hit(subjects, limits, now + 1.0)).allowed
        assert trips.count == 3
        assert (await store.hit(subjects, limits, now + 2.0)).allowed
        assert trips.count == 4 and store.refused(subjects, limits, now + 2.5) is not None
        # While Redis judges the request the copy let through, the others can wait for its answer.
        first = asyncio.create_task(store.hit(subjects, limits, now + 3.0))
        await asyncio.sleep(0)  # it is at Redis now
        judging = store.judging(subjects)
        assert judging is not None and store.refused(subjects, limits, now + 3.0) is None
        await judging
        assert (await first).allowed and store.judging(subjects) is None
        assert store.refused(subjects, limits, now + 3.0) is not None and trips.count == 5
    finally:
        await store.close()
        await other_replica.close()


async def test_redis_store_peeks_without_writing_from_its_copy_or_in_one_round_trip(redis_url):
    """(v4) The headers of a call its key's own rules refuse: `peek` writes nothing in Redis, asks
    the revocation check as a call does, and answers from the copy while the copy refuses."""
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    store, redis = RedisStore(redis_url, prefix=prefix, revoked_prefix=f"{prefix}revoked:"), Redis.from_url(redis_url)
    trips = RoundTrips(store)
    limits = Limits(per_second=1.0, burst=2, per_minute=100)
    subjects, now, known = ("acct", "key"), 1_800_000_000.0, KeyCheck(uuid.uuid4(), 1)
    try:
        peeked = [await store.peek(subjects, limits, now, known) for _ in range(5)]
        assert peeked == [Decision(True, 2, 2, 0, 0)] * 5 and trips.count == 5  # the whole burst: nothing taken
        assert await redis.exists(prefix + "acct", prefix + "key") == 0
        assert [(await store.hit(subjects, limits, now)).allowed for _ in range(2)] == [True, True]
        refusal = store.refused(subjects, limits, now + 0.5)
        assert refusal is not None and trips.count == 7
        assert await store.peek(subjects, limits, now + 0.5, known) == refusal and trips.count == 7  # from the copy
        await store.revoke(KeyCheck(known.key_id, 2), how="disabled")  # another replica's toggle
        with pytest.raises(KeyRevoked):
            await store.peek(subjects, limits, now + 1.0, known)  # the copy lets one through: Redis is asked
        assert trips.count == 8
    finally:
        await store.close()
        await redis.aclose()


async def publish_plan(settings, account_id: uuid.UUID, rate: RateLimit) -> None:
    event = PlanChanged(
        time=datetime.now(UTC), account_id=account_id, plan=Tier.BASIC, quotas=catalogue()[Tier.BASIC].quotas, rate_limit=rate
    )
    async with KafkaBroker(settings.kafka_bootstrap_servers) as broker:
        await broker.publish(event.model_dump_json().encode(), settings.topic(BILLING.name), key=str(account_id).encode())


async def _window_count(edge, subject: str) -> float:
    """Calls in the subject's current minute, from whichever store the edge limits with."""
    if isinstance(edge.limiter, MemoryStore):
        return edge.limiter._slots[subject].cur
    redis = Redis.from_url(edge.settings.redis_url)
    try:
        return float(await redis.hget(f"tollgate:rl:{subject}", "cur") or 0)
    finally:
        await redis.aclose()


async def _until(predicate, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("store", ["memory", "redis"])
async def test_plan_limits_429_with_headers_and_rejections_consume_nothing(settings, store, request):
    if store == "redis":
        settings = settings.model_copy(update={"redis_url": request.getfixturevalue("redis_url")})
    async with running_app(settings) as (app, client):
        edge = app.state.runtime.edge
        account, console = await signup(client)
        secret = (await new_key(client, console))["key"]

        first = await client.get("/api/geo/projects", headers=bearer(secret))
        free = catalogue()[Tier.FREE].rate_limit
        # The tightest limit: the bucket (burst - 1 left; full again after one token's refill).
        assert first.headers["X-RateLimit-Limit"] == str(free.burst)
        assert first.headers["X-RateLimit-Remaining"] == str(free.burst - 1)
        assert first.headers["X-RateLimit-Reset"] == str(math.ceil(1 / free.per_second))

        tight = RateLimit(per_second=0.001, burst=3, per_minute=50)
        account_id = uuid.UUID(account["id"])
        await publish_plan(settings, account_id, tight)
        await _until(lambda: edge.plans.rate_limit(account_id) == tight)
        statuses = [(await client.get("/api/geo/projects", headers=bearer(secret))).status_code for _ in range(6)]
        assert statuses == [200, 200, 200, 429, 429, 429]  # the bucket is capped at the new burst, 3
        limited = await client.get("/api/geo/projects", headers=bearer(secret))
        assert limited.status_code == 429 and code(limited) == "rate_limited"
        assert int(limited.headers["Retry-After"]) >= 1
        # The headers describe the bucket that refused (issue #41: they said the window's 46
        # left): nothing left of 3, whole again once 3 tokens are back at 0.001 a second.
        assert limited.headers["X-RateLimit-Limit"] == "3"
        assert limited.headers["X-RateLimit-Remaining"] == "0"
        assert 2000 < int(limited.headers["X-RateLimit-Reset"]) <= 3000
        # rejected calls took nothing from the window: 4 calls in it, whatever the 429s
        assert await _window_count(edge, f"a:{account_id}") == 4

        # keys follows billing.v1 too: the account now shows its plan
        async def plan() -> str:
            return str((await client.get("/api/account", headers=console)).json()["plan"])

        deadline = time.monotonic() + 10
        while await plan() != "basic":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)


async def test_every_api_key_call_becomes_a_calls_event_with_the_real_client_ip(settings):
    settings = settings.model_copy(update={"trusted_proxies": ["127.0.0.1/32", "10.0.0.0/8"]})
    async with running_app(settings) as (_app, client):
        account, console = await signup(client)
        key = await new_key(client, console)
        headers = {**bearer(key["key"]), "User-Agent": "pytest-agent/1", "X-Forwarded-For": "198.51.100.7, 203.0.113.9, 10.1.2.3"}
        assert (await client.get("/api/geo/projects", headers=headers)).status_code == 200
        project_id = str(uuid.uuid4())
        assert (await client.delete(f"/api/geo/projects/{project_id}", headers=headers)).status_code == 404
        assert (await client.get("/api/geo/projects", headers=console)).status_code == 200  # console: no event

        consumer = AIOKafkaConsumer(
            settings.topic(CALLS.name), bootstrap_servers=settings.kafka_bootstrap_servers, auto_offset_reset="earliest"
        )
        await consumer.start()
        events: list[CallEvent] = []
        try:
            deadline = time.monotonic() + 15
            while len(events) < 2 and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    events += [CallEvent.model_validate_json(r.value) for r in records]
        finally:
            await consumer.stop()
        events.sort(key=lambda e: e.time)
        assert [(e.method, e.path, e.status) for e in events] == [
            ("GET", "/api/geo/projects", 200),
            ("DELETE", "/api/geo/projects/{project_id}", 404),  # the template, not the raw URL
        ]
        for event in events:
            assert str(event.account_id) == account["id"] and str(event.api_key_id) == key["id"]
            assert event.ip == "203.0.113.9"  # the first hop not among the trusted proxies
            assert event.user_agent == "pytest-agent/1" and event.latency_ms > 0

        # keys consumes calls.v1 in batches: last_used_at appears
        deadline = time.monotonic() + 15
        while (await client.get("/api/api-keys", headers=console)).json()["items"][0]["last_used_at"] is None:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
