"""The sink's store on the real engine: the id lookup split into chunks still finds every
written id across chunk boundaries, so a redelivered batch inserts only the new events."""

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from contracts.common import Resource
from contracts.events import UsageEvent
from services.metering import store as store_module
from services.metering.store import InsertResult, MeteringStore

pytestmark = pytest.mark.integration


def usage(n: int) -> UsageEvent:
    return UsageEvent(
        time=datetime(2026, 11, 1, tzinfo=UTC) + timedelta(minutes=n),
        account_id=uuid.UUID(int=n % 3 + 1),
        resource=Resource.AI_TOKENS,
        quantity=n + 1,
        provider="openai",
        model="gpt-4o",
        source="store-test",
    )


async def test_chunked_id_lookup_drops_every_known_id(settings, monkeypatch):
    monkeypatch.setattr(store_module, "LOOKUP_CHUNK", 3)  # many chunks for a few ids
    store = MeteringStore(settings.clickhouse_dsn, settings.clickhouse_database)
    store.open()
    try:
        first = [usage(n) for n in range(10)]
        assert await store.insert_usage(first) == InsertResult(10, 0)
        fresh = [usage(n) for n in range(10, 15)]
        batch = [*fresh[:2], *reversed(first), *fresh[2:], first[4]]  # known ids spread over all chunks
        assert await store.insert_usage(batch) == InsertResult(5, 11)
        db = settings.clickhouse_database
        rows = await store.reader.run(
            lambda c: c.query(f"SELECT count(), uniqExact(id), sum(total_tokens) FROM {db}.usage_events").result_rows
        )
        assert rows == [(15, 15, sum(n + 1 for n in range(15)))]
    finally:
        store.close()
