"""Counters stay exact under duplicated and reordered events and a SIGKILLed consumer."""

import asyncio
import random
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from contracts.common import Resource
from contracts.events import UsageEvent
from contracts.topics import USAGE
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
    expected: dict[tuple[uuid.UUID, str], int] = {}
    for e in events:
        expected[(e.account_id, e.resource.value)] = expected.get((e.account_id, e.resource.value), 0) + e.quantity
    stream = events + rng.sample(events, 500)  # duplicates
    rng.shuffle(stream)
    by_key = lambda e: str(e.account_id)  # noqa: E731

    first = ServeProcess(fault_settings, targets="quota")
    try:
        first.wait_ready()
        await publish(fault_settings, USAGE.name, stream[:1000], key=by_key)

        async def some_counted():
            return sum(abs(v) for v in counters(fault_settings.database_url).values()) > 0 or None

        await eventually(some_counted)
    finally:
        first.kill()  # SIGKILL: no offsets committed for what was in flight

    await publish(fault_settings, USAGE.name, stream[1000:], key=by_key)
    await publish(fault_settings, USAGE.name, rng.sample(events, 200), key=by_key)  # redelivered after the crash
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
