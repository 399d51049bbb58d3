"""The sink's write pipeline against real Kafka and the real ClickHouse server, with no fakes:

- two sink instances of one consumer group in this process (two apps with the same settings:
  same groups, same ClickHouse database) split usage.v1 while a stream is being written, then one of them
  stops gracefully and the other takes every partition: the raw table and its hourly rollup (a
  projection that counts every copy inserted until a merge; merges are stopped here) hold each
  event exactly once;
- writes that fail are fetched again and nothing behind them is lost or counted twice.

`MeteringStore.insert_usage` is wrapped at class level before the apps are built (the sink binds
it then) to record every write and, in the second test, to make some fail. In the first test the
engine's INSERT is also made slower (a sleep between the lookup of known ids and the insert), so
that rebalances land while writes are in flight.
"""

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner
from fastapi import FastAPI

from contracts.common import Resource
from contracts.events import UsageEvent
from contracts.topics import USAGE
from services.metering import consumers, pipeline
from services.metering.store import InsertResult, MeteringStore
from services.runtime.host.app import create_app
from services.runtime.platform.kafka import ensure_topics
from services.runtime.platform.settings import Settings
from tests.support.metering import metering_sink, wait_until

pytestmark = pytest.mark.integration

log = logging.getLogger(__name__)

START = datetime(2026, 9, 1, tzinfo=UTC)
# Every write of the rebalance test spends this long in the engine between its lookup of known
# ids and its insert, so a rebalance (about every 3 s heartbeat) lands while writes are in flight.
SLOW_INSERT_S = 1.0


def usage(account: uuid.UUID, n: int) -> UsageEvent:
    return UsageEvent(
        time=START + timedelta(seconds=7 * n),  # ~6 days: many account-hours, one month
        account_id=account,
        resource=Resource.AI_TOKENS,
        quantity=n % 89 + n % 53 + 1,  # the split adds up to the quantity (contracts/usage_rules.py)
        provider="openai",
        model="gpt-4o",
        input_tokens=n % 89,
        output_tokens=n % 53 + 1,
        source="rebalance-test",
    )


def tokens(events: list[UsageEvent]) -> int:
    return sum((e.input_tokens or 0) + (e.output_tokens or 0) for e in events)


def accounts_on_every_partition(per_partition: int = 2) -> list[uuid.UUID]:
    """Accounts whose keys (as the producer partitions them) cover every partition of usage.v1."""
    partitions = list(range(USAGE.partitions))
    by_partition: dict[int, list[uuid.UUID]] = {p: [] for p in partitions}
    while any(len(found) < per_partition for found in by_partition.values()):
        account = uuid.uuid4()
        found = by_partition[DefaultPartitioner()(str(account).encode(), partitions, partitions)]
        if len(found) < per_partition:
            found.append(account)
    return [a for found in by_partition.values() for a in found]


@dataclass
class Write:
    store: MeteringStore
    at: float
    lines: list[bytes]
    result: InsertResult | None = None
    error: BaseException | None = None
    end: float | None = None


@dataclass
class Writes:
    """Every `insert_usage` call of every store in this process, in the order they started."""

    calls: list[Write] = field(default_factory=list)

    def of(self, store: MeteringStore, *, after: float = 0.0, before: float = float("inf")) -> list[Write]:
        return [w for w in self.calls if w.store is store and after <= w.at < before]

    def inserted(self, store: MeteringStore, *, after: float = 0.0, before: float = float("inf")) -> int:
        return sum(w.result.inserted for w in self.of(store, after=after, before=before) if w.result)

    def containing(self, event_id: str) -> list[Write]:
        return [w for w in self.calls if any(event_id in line for line in map(bytes.decode, w.lines))]


def observe_inserts(
    monkeypatch: pytest.MonkeyPatch, fail: Callable[[int], bool] = lambda call: False, fail_after: float = 0.0
) -> Writes:
    """Wrap `MeteringStore.insert_usage` (delegating to the real one) to record each call;
    `fail(n)` makes the n-th call (1-based) raise after `fail_after` seconds instead of writing."""
    writes = Writes()
    real = MeteringStore.insert_usage

    async def insert_usage(self: MeteringStore, lines: list[bytes], canonical: Any, *flagged: Any) -> InsertResult:
        write = Write(self, time.monotonic(), lines)
        writes.calls.append(write)
        try:
            if fail(len(writes.calls)):
                await asyncio.sleep(fail_after)
                raise RuntimeError(f"injected failure of write {len(writes.calls)}")
            write.result = await real(self, lines, canonical, *flagged)
        except BaseException as exc:
            write.error = exc
            raise
        finally:
            write.end = time.monotonic()
        return write.result

    monkeypatch.setattr(MeteringStore, "insert_usage", insert_usage)
    return writes


def slow_engine_inserts(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The engine takes `seconds` more for the INSERT ... SELECT into usage_events, after the
    batch's ids were looked up (as a large insert on a busy server does): every write is in
    flight for a while, between its lookup of known ids and its rows becoming visible."""
    real = MeteringStore._insert_new

    class SlowInsert:
        def __init__(self, client: Any, table: str) -> None:
            self._client, self._table = client, table

        def __getattr__(self, name: str) -> Any:
            return getattr(self._client, name)

        def command(self, sql: str, *args: Any, **kwargs: Any) -> Any:
            if sql.startswith(f"INSERT INTO {self._table} "):
                time.sleep(seconds)
            return self._client.command(sql, *args, **kwargs)

    def _insert_new(self: MeteringStore, client: Any, sink: Any, lines: list[bytes], *rest: Any) -> InsertResult:
        return real(self, SlowInsert(client, f"{self.db}.{sink.table}"), sink, lines, *rest)

    monkeypatch.setattr(MeteringStore, "_insert_new", _insert_new)


def store_of(app: FastAPI) -> MeteringStore:
    (metering,) = [c for c in app.state.components if c.name == "metering"]
    return metering.checks["clickhouse"].__self__  # the store's bound `ping`


def usage_consumer(app: FastAPI, settings: Settings) -> AIOKafkaConsumer | None:
    (usage,) = [t for t in metering_sink(app).topics if t.topic == settings.topic(USAGE.name)]
    return usage.consumer


def assigned(app: FastAPI, settings: Settings) -> set[TopicPartition]:
    consumer = usage_consumer(app, settings)
    return set(consumer.assignment()) if consumer is not None else set()


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[FastAPI]:
    app = create_app(["metering"], settings)
    async with app.router.lifespan_context(app):
        yield app


async def produce(settings: Settings, events: list[UsageEvent], chunk: int, pause: float) -> None:
    """A steady stream: `chunk` events, every ack awaited, then a pause. Each record's timestamp
    is its event's time, as a backfill of history sets it (the sink judges an event's time
    against its record's: contracts/usage_rules.py)."""
    topic = settings.topic(USAGE.name)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all", linger_ms=5)
    await producer.start()
    try:
        for i in range(0, len(events), chunk):
            futures = [
                await producer.send(
                    topic,
                    e.model_dump_json().encode(),
                    key=str(e.account_id).encode(),
                    timestamp_ms=int(e.time.timestamp() * 1000),
                )
                for e in events[i : i + chunk]
            ]
            await asyncio.gather(*futures)
            await asyncio.sleep(pause)
    finally:
        await producer.stop()


@asynccontextmanager
async def engine(settings: Settings) -> AsyncIterator[Callable[[str], Awaitable[list[tuple]]]]:
    """A store of the test's own on the test's engine path and database (schema applied), with
    merges of the raw table stopped: a copy inserted twice stays visible in both the raw
    counts and the rollup until the end of the test (no OPTIMIZE, no FINAL, no merge)."""
    store = MeteringStore(settings.clickhouse_dsn, settings.clickhouse_database)
    await asyncio.to_thread(store.open)
    db = settings.clickhouse_database

    async def query(sql: str) -> list[tuple]:
        return await store.reader.run(lambda c: c.query(sql.format(db=db)).result_rows)

    await store.writer.run(lambda c: c.command(f"SYSTEM STOP MERGES {db}.usage_events"))
    try:
        yield query
    finally:
        await store.writer.run(lambda c: c.command(f"SYSTEM START MERGES {db}.usage_events"))
        await asyncio.to_thread(store.close)


async def exact_counts(query: Callable[[str], Awaitable[list[tuple]]]) -> tuple[int, int, int, int]:
    (rows, ids), *_ = await query("SELECT count(), uniqExact(id) FROM {db}.usage_events")
    (events, total), *_ = await query("SELECT sum(events), sum(total_tokens) FROM {db}.usage_hourly")
    return int(rows), int(ids), int(events or 0), int(total or 0)


@asynccontextmanager
async def group_offsets(settings: Settings) -> AsyncIterator[Callable[[], Awaitable[bool]]]:
    """`caught_up()`: every partition of usage.v1 committed up to its end by the sink's group
    (read by a consumer of its own that never joins the group)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap_servers, group_id=settings.group("metering.usage"))
    await consumer.start()
    tps = [TopicPartition(settings.topic(USAGE.name), p) for p in range(USAGE.partitions)]

    async def caught_up() -> bool:
        ends = await consumer.end_offsets(tps)
        return all([await consumer.committed(tp) == ends[tp] for tp in tps])

    try:
        yield caught_up
    finally:
        await consumer.stop()


@dataclass
class Revoke:
    at: float
    partitions: int
    writes_in_flight: int  # usage writes running (in any store) when the listener was called


def observe_revokes(monkeypatch: pytest.MonkeyPatch, writes: Writes, topic: str) -> list[Revoke]:
    revokes: list[Revoke] = []
    real = pipeline.DrainOnRevoke.on_partitions_revoked

    async def on_partitions_revoked(self: pipeline.DrainOnRevoke, revoked: set[TopicPartition]) -> None:
        if any(tp.topic == topic for tp in revoked):
            running = sum(1 for w in writes.calls if w.end is None)
            revokes.append(Revoke(time.monotonic(), len(revoked), running))
        await real(self, revoked)

    monkeypatch.setattr(pipeline.DrainOnRevoke, "on_partitions_revoked", on_partitions_revoked)
    return revokes


async def _positive(read: Callable[[], Awaitable[int]]) -> bool:
    return await read() > 0


async def test_a_rebalance_while_batches_are_in_flight_counts_each_event_once(settings, monkeypatch, caplog):
    """A writes; B joins (A's six partitions are split 3/3 while A has a write in flight); A stops
    gracefully mid-stream (B takes all six while A's last write is in flight); B drains the rest.
    A partition given up while its batch is still being written would be fetched again from its
    committed offsets by the new owner, and the two writes' lookups would both miss the ids."""
    caplog.set_level(logging.INFO, logger="services.metering")
    caplog.set_level(logging.INFO, logger=__name__)
    writes = observe_inserts(monkeypatch)
    revokes = observe_revokes(monkeypatch, writes, settings.topic(USAGE.name))
    slow_engine_inserts(monkeypatch, SLOW_INSERT_S)
    await ensure_topics(settings)
    accounts = accounts_on_every_partition()
    n = 80_000
    events = [usage(accounts[i % len(accounts)], i) for i in range(n)]
    streamed, after_a_stopped = events[:60_000], events[60_000:]

    async with engine(settings) as query, AsyncExitStack() as a_stack, AsyncExitStack() as b_stack:

        async def visible() -> int:
            return int((await query("SELECT count() FROM {db}.usage_events"))[0][0])

        first = await a_stack.enter_async_context(running(settings))
        a_store = store_of(first)
        t0 = time.monotonic()
        producing = asyncio.create_task(produce(settings, streamed, chunk=1_000, pause=0.15))
        try:
            await wait_until(lambda: _positive(visible), timeout=30, interval=0.05)

            # B joins the group while A is writing: usage.v1's partitions are split between them.
            b_started = time.monotonic()
            at_b_start = await visible()
            second = await b_stack.enter_async_context(running(settings))
            b_store = store_of(second)

            async def split() -> bool:
                a, b = assigned(first, settings), assigned(second, settings)
                return bool(a) and bool(b) and not (a & b) and len(a | b) == USAGE.partitions

            await wait_until(split, timeout=30, interval=0.05)
            split_at = time.monotonic()

            async def both_writing() -> bool:
                return writes.inserted(a_store, after=split_at) > 0 and writes.inserted(b_store, after=split_at) > 0

            await wait_until(both_writing, timeout=30, interval=0.05)

            # A stops (a graceful shutdown) in the middle of the stream: B takes every partition.
            a_stopping = time.monotonic()
            at_a_stop = await visible()
            await a_stack.aclose()
            a_stopped = time.monotonic()
            await producing
            stream_done = time.monotonic()
            await produce(settings, after_a_stopped, chunk=2_000, pause=0.05)

            async def b_owns_all() -> bool:
                return len(assigned(second, settings)) == USAGE.partitions

            await wait_until(b_owns_all, timeout=30, interval=0.05)
            async with group_offsets(settings) as caught_up:
                await wait_until(caught_up, timeout=60, interval=0.2)
            await asyncio.sleep(0.5)  # nothing more may arrive: a late write would show below
        finally:
            producing.cancel()

        counts = await exact_counts(query)
        twice = await query("SELECT toString(id) FROM {db}.usage_events GROUP BY id HAVING count() > 1 LIMIT 3")
        names = {id(a_store): "A", id(b_store): "B"}
        for (event_id,) in twice:  # which writes wrote it, when (s from the start), and what they found
            log.warning(
                "written twice: %s by %s",
                event_id,
                [
                    (names[id(w.store)], round(w.at - t0, 2), round((w.end or 0) - t0, 2), len(w.lines), w.result)
                    for w in writes.containing(event_id)
                ],
            )
        log.info(
            "visible at B's start %d, at A's stop %d; inserted by A %d (%d after the split), by B %d (%d after A "
            "stopped); usage revokes %s; counts %s; timeline: B start %.1f, split %.1f, A stopping %.1f, stopped %.1f, "
            "stream done %.1f",
            at_b_start,
            at_a_stop,
            writes.inserted(a_store),
            writes.inserted(a_store, after=split_at),
            writes.inserted(b_store),
            writes.inserted(b_store, after=a_stopped),
            [(round(r.at - t0, 2), r.partitions, r.writes_in_flight) for r in revokes],
            counts,
            b_started - t0,
            split_at - t0,
            a_stopping - t0,
            a_stopped - t0,
            stream_done - t0,
        )
        # The rebalances happened while the stream was being written, and both sinks wrote.
        assert 0 < at_b_start < at_a_stop < n
        assert writes.inserted(a_store, before=b_started) > 0
        assert writes.inserted(a_store, after=split_at) > 0 and writes.inserted(b_store, before=a_stopped) > 0
        assert writes.inserted(b_store, after=a_stopped) > 0

        # Each event once: raw rows, distinct ids, and the rollup (which counts every copy).
        assert counts == (n, n, n, tokens(events))
        assert writes.inserted(a_store) + writes.inserted(b_store) == n


async def test_a_failed_write_is_fetched_again_and_nothing_behind_it_is_lost(settings, monkeypatch, caplog):
    """The 2nd and 3rd writes raise: the failed batch (and the one fetched behind it, dropped) are
    fetched again and written, their offsets committed only after that."""
    caplog.set_level(logging.INFO, logger="services.metering")
    monkeypatch.setattr(pipeline, "RETRY_DELAY_S", 0.05)
    # Writes take a while (failed ones too, as an engine timing out does), so the batch fetched
    # behind each one has records of the same partitions: the rewind must go to the failed
    # batch's offsets, not the dropped one's.
    writes = observe_inserts(monkeypatch, fail=lambda call: call in (2, 3), fail_after=0.3)
    slow_engine_inserts(monkeypatch, 0.3)
    await ensure_topics(settings)
    accounts = accounts_on_every_partition()
    n = 30_000
    events = [usage(accounts[i % len(accounts)], i) for i in range(n)]

    async with engine(settings) as query, running(settings) as app:
        store = store_of(app)
        await produce(settings, events, chunk=1_500, pause=0.15)
        # Each batch's offsets are committed after its write: once the group is committed up to
        # the end, everything the sink will ever write for this stream is written.
        async with group_offsets(settings) as caught_up:
            await wait_until(caught_up, timeout=30, interval=0.1)
        await asyncio.sleep(0.3)

        failed = [w for w in writes.calls if w.error is not None]
        log.info(
            "%d writes (%d failed), %d inserted, %d duplicates",
            len(writes.calls),
            len(failed),
            writes.inserted(store),
            sum(w.result.duplicates for w in writes.calls if w.result),
        )
        assert [writes.calls.index(w) + 1 for w in failed] == [2, 3]
        assert all(w.store is store for w in writes.calls)
        assert len(writes.calls) >= 5  # several batches, the failed ones and more behind them
        assert await exact_counts(query) == (n, n, n, tokens(events))
        assert writes.inserted(store) == n
        assert "handling failed; trying again in" in caplog.text  # logged once per attempt, after a backoff


async def test_a_failed_last_write_is_written_again_without_more_traffic(settings, monkeypatch):
    """The stream's only batch fails to write and nothing arrives after it: the pipeline rewinds
    at once, so the batch is fetched and written again (not left until the next event)."""
    monkeypatch.setattr(pipeline, "RETRY_DELAY_S", 0.05)
    writes = observe_inserts(monkeypatch, fail=lambda call: call == 1)
    await ensure_topics(settings)
    accounts = accounts_on_every_partition(per_partition=1)
    events = [usage(accounts[i % len(accounts)], i) for i in range(2_000)]

    async with engine(settings) as query, running(settings) as app:
        store = store_of(app)
        await produce(settings, events, chunk=2_000, pause=0)
        async with group_offsets(settings) as caught_up:
            await wait_until(caught_up, timeout=20, interval=0.1)
        assert writes.calls[0].error is not None and len(writes.calls) >= 2
        assert all(w.store is store for w in writes.calls)
        assert await exact_counts(query) == (len(events), len(events), len(events), tokens(events))


async def test_a_failure_in_the_consumer_loop_joins_again_from_the_committed_offsets(settings, monkeypatch, caplog):
    """Something unforeseen raises in the sink's loop right after a fetch (here: the 2nd batch,
    whose records the consumer has already moved past): the sink leaves the group and joins
    again from its committed offsets, so that batch is fetched again and nothing is lost."""
    monkeypatch.setattr(pipeline, "RETRY_DELAY_S", 0.05)
    monkeypatch.setattr(consumers, "FETCH_MIN_BYTES", 1)  # a batch per produced chunk, not per broker wait
    real = pipeline.Batch.of
    calls = 0

    def of(fetched: pipeline.Fetched) -> pipeline.Batch:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("injected failure after a fetch")
        return real(fetched)

    monkeypatch.setattr(pipeline.Batch, "of", staticmethod(of))
    await ensure_topics(settings)
    accounts = accounts_on_every_partition(per_partition=1)
    events = [usage(accounts[i % len(accounts)], i) for i in range(6_000)]

    async with engine(settings) as query, running(settings) as app:
        first_consumer = usage_consumer(app, settings)
        await produce(settings, events, chunk=1_000, pause=0.3)
        async with group_offsets(settings) as caught_up:
            await wait_until(caught_up, timeout=30, interval=0.1)
        assert calls > 3  # the failure, and batches after it
        assert await exact_counts(query) == (len(events), len(events), len(events), tokens(events))
        assert usage_consumer(app, settings) is not first_consumer  # joined again
        assert "joining again from the committed offsets" in caplog.text
