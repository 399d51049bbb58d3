"""Counters stay exact under duplicated and reordered events and a SIGKILLed consumer: usage.v1
(quota.usage, each batch as it comes) and calls.v1 (quota.calls, gathered for up to a second)."""

import asyncio
import random
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from contracts.common import Resource
from contracts.events import CallEvent, UsageEvent
from contracts.topics import CALLS, USAGE
from tests.integration.quota_helpers import eventually, publish
from tests.support.apps import ServeProcess

pytestmark = pytest.mark.integration


def counters(database_url: str) -> dict[tuple[uuid.UUID, str], int]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT account_id, resource, sum(used) FROM quota.counters GROUP BY 1, 2").fetchall()
    return {(a, r): int(n) for a, r, n in rows}


async def test_counts_are_exact_under_duplicates_reordering_and_sigkill(fault_settings):
    rng = random.Random(7)
    accounts = [uuid.uuid4() for _ in range(3)]
    base = datetime.now(UTC)
    events = []
    for _ in range(1500):
        resource = rng.choice([Resource.AI_TOKENS, Resource.GEO_PROJECTS])
        events.append(
            UsageEvent(
                time=base - timedelta(seconds=rng.randint(0, 600)),  # out of time order on purpose
                account_id=rng.choice(accounts),
                resource=resource,
                # signed deltas on the stock; a flow's quantity is never negative (contracts/usage_rules.py)
                quantity=rng.randint(-3 if resource is Resource.GEO_PROJECTS else 0, 40),
                source="test",
            )
        )
    calls = [
        CallEvent(
            time=base - timedelta(seconds=rng.randint(0, 600)),
            account_id=rng.choice(accounts),
            api_key_id=uuid.uuid4(),
            method="GET",
            path="/api/geo/projects",
            status=200,
            ip="10.0.0.1",
            latency_ms=1.5,
        )
        for _ in range(900)
    ]
    expected: dict[tuple[uuid.UUID, str], int] = {}
    for e in events:
        expected[(e.account_id, e.resource.value)] = expected.get((e.account_id, e.resource.value), 0) + e.quantity
    for c in calls:
        expected[(c.account_id, Resource.API_CALLS.value)] = expected.get((c.account_id, Resource.API_CALLS.value), 0) + 1
    stream = events + rng.sample(events, 500)  # duplicates
    rng.shuffle(stream)
    call_stream = calls + rng.sample(calls, 300)
    rng.shuffle(call_stream)
    by_key = lambda e: str(e.account_id)  # noqa: E731

    first = ServeProcess(fault_settings, targets="quota")
    try:
        first.wait_ready()
        await publish(fault_settings, USAGE.name, stream[:1000], key=by_key)
        await publish(fault_settings, CALLS.name, call_stream[:600], key=by_key)

        async def some_counted():
            got = counters(fault_settings.database_url)
            calls_counted = sum(v for (_, resource), v in got.items() if resource == Resource.API_CALLS.value)
            return (calls_counted > 0 and sum(abs(v) for v in got.values()) > calls_counted) or None

        await eventually(some_counted)
    finally:
        first.kill()  # SIGKILL: no offsets committed for what was in flight

    await publish(fault_settings, USAGE.name, stream[1000:], key=by_key)
    await publish(fault_settings, USAGE.name, rng.sample(events, 200), key=by_key)  # redelivered after the crash
    await publish(fault_settings, CALLS.name, call_stream[600:], key=by_key)
    await publish(fault_settings, CALLS.name, rng.sample(calls, 150), key=by_key)
    second = ServeProcess(fault_settings, targets="quota")
    try:
        second.wait_ready()

        async def all_counted():
            got = counters(fault_settings.database_url)
            return got if all(got.get(k) == v for k, v in expected.items()) else None

        got = await eventually(all_counted, within=60)
        await asyncio.sleep(0.5)  # nothing more may arrive: the counts stay put
        assert counters(fault_settings.database_url) == got
        assert {k: v for k, v in got.items() if k in expected} == expected
    finally:
        second.stop()
