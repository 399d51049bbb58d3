"""The sink's store on the real engine: the engine reads each event's JSON exactly as the
contract model does (or the store falls back to the model's own JSON), derives the stored
columns by the documented rules, and writes each event id once, across batches and within one."""

import json
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from contracts.common import Resource
from contracts.events import UsageEvent
from services.metering import sink_tables
from services.metering import store as metering_store
from services.metering.ingest import canonical
from services.metering.store import MIGRATIONS, InsertResult, MeteringStore, UsageQuery
from tests.support.infra import drop_clickhouse_database

pytestmark = pytest.mark.integration

TO_CANONICAL = canonical(UsageEvent)


def usage(n: int, **fields) -> UsageEvent:
    values = dict(
        time=datetime(2026, 11, 1, tzinfo=UTC) + timedelta(minutes=n),
        account_id=uuid.UUID(int=n % 3 + 1),
        resource=Resource.AI_TOKENS,
        quantity=n + 1,
        provider="openai",
        model="gpt-4o",
        source="store-test",
    )
    return UsageEvent(**(values | fields))


def line(e: UsageEvent) -> bytes:
    return e.model_dump_json().encode()


@pytest.fixture
async def store(settings):
    store = MeteringStore(settings.clickhouse_dsn, settings.clickhouse_database)
    store.open()
    yield store
    store.close()


async def rows(store: MeteringStore, sql: str) -> list[tuple]:
    db = store.db
    return await store.reader.run(lambda c: c.query(sql.format(db=db)).result_rows)


async def test_each_id_is_written_once_across_batches_and_within_one(store):
    first = [usage(n) for n in range(10)]
    assert await store.insert_usage([line(e) for e in first], TO_CANONICAL) == InsertResult(10, 0)
    fresh = [usage(n) for n in range(10, 15)]
    batch = [*fresh[:2], *reversed(first), *fresh[2:], first[4], fresh[0]]
    assert await store.insert_usage([line(e) for e in batch], TO_CANONICAL) == InsertResult(5, 12)
    # The same event republished with its time moved within the hour is still the same event.
    moved = first[3].model_copy(update={"time": first[3].time + timedelta(seconds=7)})
    assert await store.insert_usage([line(moved)], TO_CANONICAL) == InsertResult(0, 1)
    assert await rows(store, "SELECT count(), uniqExact(id), sum(total_tokens) FROM {db}.usage_events") == [
        (15, 15, sum(n + 1 for n in range(15)))
    ]
    assert await rows(store, "SELECT sum(events) FROM {db}.usage_hourly") == [(15,)]
    assert await store.insert_usage([], TO_CANONICAL) == InsertResult(0, 0)  # a batch of dead letters only


async def test_a_large_batch_counts_exactly_what_it_wrote(store):
    """The count comes from the INSERT's own summary: exact over a batch of many blocks, half of
    it written before, with duplicates within it."""
    batch = [line(usage(n)) for n in range(40_000)]
    assert await store.insert_usage(batch[::2], TO_CANONICAL) == InsertResult(20_000, 0)
    assert await store.insert_usage(batch + batch[:100], TO_CANONICAL) == InsertResult(20_000, 20_100)
    assert await rows(store, "SELECT count(), uniqExact(id) FROM {db}.usage_events") == [(40_000, 40_000)]


def months_apart(n: int, months: int, **fields) -> UsageEvent:
    """Event n of a backfill with one event in each of `months` months, back from 2026-10."""
    year, month = divmod(2026 * 12 + 9 - n % months, 12)
    return usage(n, time=datetime(year, month + 1, 15, 12, n // months, tzinfo=UTC), **fields)


async def test_a_batch_over_more_months_than_one_insert_may_touch_is_written_whole_and_once(store):
    """The engine refuses an INSERT touching more than 100 partitions (code 252); the tables are
    partitioned by month, and a backfill's batch may span years. Written in several INSERTs, the
    batch is still written once: one process killed between two, its redelivery writes the rest."""
    batch = [line(months_apart(n, 130)) for n in range(260)]
    done_before_a_kill = batch[::3]  # any of its INSERTs, and any part of one (they commit part by part)
    assert await store.insert_usage(done_before_a_kill, TO_CANONICAL) == InsertResult(87, 0)
    assert await store.insert_usage(batch + batch[:5], TO_CANONICAL) == InsertResult(173, 92)
    assert await rows(store, "SELECT count(), uniqExact(id), uniqExact(toYYYYMM(time)) FROM {db}.usage_events") == [
        (260, 260, 130)
    ]
    assert await rows(store, "SELECT sum(events) FROM {db}.usage_hourly") == [(260,)]


async def test_the_engine_stores_what_the_model_reads(store):
    """Forms the contract accepts, some of which the engine cannot read (it then gets the
    model's JSON) or would read differently if it were let (a key given twice)."""
    base = usage(0)
    forms = [
        {"time": "2026-11-22T10:02:02.332388Z"},
        {"time": "2026-11-22T10:02:02+05:30"},
        {"time": "2026-11-22 10:02:02Z"},
        {"time": "2026-11-22t10:02:02z"},  # the engine refuses a lower-case t
        {"time": "2026-11-22T10:02:02.123456789Z"},
        {"time": "2026-11-22T10:02:02-0800"},
        {"time": "2026-11-22T23:59:59.9999Z"},
        {"id": f"{{{uuid.uuid4()}}}"},  # braces: the engine refuses them
        {"id": uuid.uuid4().hex.upper()},
        {"provider": "café", "model": None},  # json.dumps escapes it: \u00e9
        {"input_tokens": 5, "output_tokens": None, "quantity": 99},
        {"input_tokens": None, "output_tokens": None, "quantity": -4},
    ]
    docs = []
    for n, form in enumerate(forms):
        body = json.loads(base.model_dump_json()) | {"id": str(uuid.uuid4()), "quantity": n + 1} | form
        docs.append(json.dumps(body).encode())
    expected = {}
    for doc in docs:
        e = UsageEvent.model_validate_json(doc)
        expected[e.id] = e
    assert await store.insert_usage(docs, TO_CANONICAL) == InsertResult(len(docs), 0)
    # Alone in its batch (the forms above send the whole batch through the model already):
    twice = json.dumps(json.loads(docs[0]) | {"id": str(uuid.uuid4()), "quantity": 1}).encode()[:-1] + b', "quantity": 999}'
    e = UsageEvent.model_validate_json(twice)
    assert e.quantity == 999  # the model reads the last
    expected[e.id] = e
    assert await store.insert_usage([twice], TO_CANONICAL) == InsertResult(1, 0)
    stored = await rows(
        store,
        "SELECT id, toUnixTimestamp64Milli(time), quantity, provider, model, input_tokens, output_tokens, total_tokens "
        "FROM {db}.usage_events",
    )
    assert len(stored) == len(expected)
    for id_, millis, quantity, provider, model, i, o, total in stored:
        e = expected[id_]
        assert millis == int(e.time.timestamp() * 1000 // 1), e
        assert (quantity, provider, model) == (e.quantity, e.provider or "unknown", e.model or "unknown")
        assert (i, o) == (e.input_tokens or 0, e.output_tokens or 0)
        split = e.input_tokens is not None or e.output_tokens is not None
        assert total == ((e.input_tokens or 0) + (e.output_tokens or 0) if split else max(e.quantity, 0))


def spread(n: int) -> UsageEvent:
    """Over two months' partitions and three days, with and without a key, two models."""
    model = ("openai", "gpt-4o") if n % 2 else ("google", "gemini-2.5-flash")
    return usage(
        n,
        time=datetime(2026, 10, 31, tzinfo=UTC) + timedelta(minutes=3 * n),
        provider=model[0],
        model=model[1],
        input_tokens=n,
        output_tokens=1,
        api_key_id=uuid.UUID(int=9) if n % 3 else None,
    )


async def analytics_reads(store: MeteringStore) -> list[object]:
    """What the overview, by-provider and trend read of account 1, over three days."""
    end = datetime(2026, 11, 3, 2, tzinfo=UTC)
    q = UsageQuery(uuid.UUID(int=1), end - timedelta(days=3), end)
    answers: list[object] = [await store.daily_rows_split(q, end - timedelta(days=2, hours=5), end - timedelta(days=1))]
    for per, group_by in (("day", None), ("hour", "model"), ("hour", "api_key")):
        answers += [block async for block in store.stream_usage(q, per=per, group_by=group_by, at_once=True)]
    return answers


async def test_the_analytics_reads_are_answered_from_the_hourly_projection(store, monkeypatch):
    """Overview, by-provider and trend read the `hourly` projection, never the raw rows (a read
    the projection could not answer would still be right, and slower by far at 100M events)."""
    await store.insert_usage([line(spread(n)) for n in range(1500)], TO_CANONICAL)
    seen: list[tuple[str, dict]] = []
    for client in store.reader.clients:

        def query(sql: str, parameters: dict, _query=client.query, **kw):
            seen.append((sql, parameters))
            return _query(sql, parameters=parameters, **kw)

        monkeypatch.setattr(client, "query", query)
    assert all(await analytics_reads(store))
    monkeypatch.undo()
    assert len(seen) == 4
    for sql, params in seen:
        explain = f"EXPLAIN projections = 1 {sql}"
        lines = await store.reader.run(lambda c, e=explain, p=params: c.query(e, parameters=p).result_rows)
        plan = "\n".join(line[0] for line in lines)
        assert "ReadFromMergeTree (hourly)" in plan, plan
        assert f"ReadFromMergeTree ({store.db}.usage_events)" not in plan, plan


async def test_the_rollup_migration_keeps_an_existing_database_answering_the_same(settings, tmp_path, monkeypatch):
    """0006 rebuilds the `hourly` projection in the parts written before it: same answers after."""
    for path in sorted(MIGRATIONS.glob("*.sql")):
        if path.name < "0006":
            (tmp_path / path.name).write_text(path.read_text())
    monkeypatch.setattr(metering_store, "MIGRATIONS", tmp_path)
    # the sink of that schema: without (v4, 0008) the column model_not_allowed
    usage = sink_tables.USAGE
    columns, select = usage.columns.removesuffix(", model_not_allowed"), usage.select.rsplit(", has(", 1)[0]
    before_0008 = replace(usage, columns=columns, select=select)
    monkeypatch.setattr(sink_tables, "USAGE", before_0008)
    # a database of its own: the test's environment is migrated to the newest schema already
    settings = settings.model_copy(update={"clickhouse_database": f"{settings.clickhouse_database}_old"})
    old = MeteringStore(settings.clickhouse_dsn, settings.clickhouse_database)
    old.open()
    try:
        await old.insert_usage([line(spread(n)) for n in range(1500)], TO_CANONICAL)
        before, hourly = await analytics_reads(old), await rows(old, "SELECT * FROM {db}.usage_hourly ORDER BY ALL")
        assert "index_granularity = 256" not in (await rows(old, "SHOW CREATE TABLE {db}.usage_events"))[0][0]
    finally:
        old.close()
    monkeypatch.undo()
    new = MeteringStore(settings.clickhouse_dsn, settings.clickhouse_database)
    new.open()  # applies 0006
    try:
        assert "index_granularity = 256" in (await rows(new, "SHOW CREATE TABLE {db}.usage_events"))[0][0]
        assert all(before)
        assert await analytics_reads(new) == before
        assert await rows(new, "SELECT * FROM {db}.usage_hourly ORDER BY ALL") == hourly
    finally:
        new.close()
        drop_clickhouse_database(settings.clickhouse_dsn, settings.clickhouse_database)
