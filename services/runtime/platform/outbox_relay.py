"""The transactional outbox: rows written with the change, published in order by a relay.

A service inserts `(topic, key, value)` rows into its own `<schema>.outbox` table inside the
transaction that makes the change (`OutboxRelay.add`). The relay publishes unsent rows in `seq`
order with an idempotent, acks=all producer and marks them sent. A Postgres advisory lock makes
one relay at a time publish, so replicas never reorder a key's states. `flush()` lets a request
wait until its own rows are in Kafka (it runs a pass after the caller's commit, which therefore
sees the rows: they are either sent by this pass or were sent by the holder before it).

Every replica's relay LISTENs on its outbox's channel, and `add` NOTIFYs it: a commit with rows
wakes the relays at once, whoever wrote them (a process that crashed before its flush, a CLI).
The relay's own pass every `interval_s` only stands in should a wake-up be missed: an idle relay
costs no query more often than that.

Sent rows are kept `OUTBOX_RETENTION_SECONDS` (what was published when, for debugging and audit),
then deleted by the relay's pruner (services/runtime/platform/pruner.py): a task of its own, so a long
delete never delays publishing, and apart from the publishing lock: it never touches an unsent row,
the only rows the publisher reads or writes. Every replica runs one; a try-lock lets one at a time work.
"""

import asyncio
import logging
from typing import Any, cast

from aiokafka import AIOKafkaProducer
from prometheus_client import Gauge
from psycopg import AsyncConnection, sql
from psycopg.generators import notifies
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from contracts.topics import Topic
from services.runtime.platform.kafka import PRODUCER_CONFIG, STALE_PRODUCER_ERRORS, retire
from services.runtime.platform.periodic import Periodic
from services.runtime.platform.pruner import Pruner
from services.runtime.platform.settings import Settings

log = logging.getLogger(__name__)

RETRY_S = 0.5  # after a failed pass (Kafka or Postgres away)
LISTEN_CHECK_S = 3600.0  # the listener's timer while no notification comes (psycopg's: 0.1 s)
BACKLOG_INTERVAL_S = 15.0  # how often the relay reads its backlog for /metrics

# Every replica's relay reads the same table: the most recent reading is the truth.
BACKLOG_ROWS = Gauge(
    "tollgate_outbox_unsent_rows",
    "Rows of a service's outbox not yet published to Kafka, by service (unit: rows)",
    ["service"],
    multiprocess_mode="mostrecent",
)
BACKLOG_AGE = Gauge(
    "tollgate_outbox_oldest_unsent_age_seconds",
    "Age of the oldest row of a service's outbox not yet published to Kafka, 0 when none, by service (unit: seconds)",
    ["service"],
    multiprocess_mode="mostrecent",
)


def _bytes(value: bytes | memoryview | None) -> bytes | None:
    return None if value is None else bytes(value)


class OutboxRelay:
    def __init__(
        self,
        pool: AsyncConnectionPool,
        settings: Settings,
        schema: str,
        *,
        interval_s: float = 30.0,
        batch: int = 500,
    ) -> None:
        self._pool = cast("AsyncConnectionPool[AsyncConnection[DictRow]]", pool)  # dict rows
        self._settings = settings
        self._table = sql.Identifier(schema, "outbox")
        self._lock_name = f"{schema}.outbox"
        self._schema = schema
        self._channel = f"{schema}_outbox"
        self._interval = interval_s
        self._batch = batch
        self._local = asyncio.Lock()
        self._wake = asyncio.Event()
        self._producer: AIOKafkaProducer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # `sent_at < cutoff` is never true of an unsent row (NULL): only sent rows are deleted.
        self._pruner = Pruner(
            pool,
            schema,
            "outbox",
            key="seq",
            column="sent_at",
            keep_s=settings.outbox_retention_seconds,
            interval_s=settings.prune_interval_seconds,
        )
        self._backlog = Periodic(
            f"relay-backlog:{schema}", BACKLOG_INTERVAL_S, self.export_backlog, what=f"reading {schema}'s outbox backlog", log=log
        )

    async def export_backlog(self) -> None:
        """Set the backlog gauges: unsent rows and the oldest one's age (the unsent rows' index)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                sql.SQL(
                    "SELECT count(*) AS rows, coalesce(extract(epoch FROM now() - min(created_at)), 0) AS age "
                    "FROM {} WHERE sent_at IS NULL"
                ).format(self._table)
            )
            row = await cur.fetchone()
        assert row is not None
        BACKLOG_ROWS.labels(self._schema).set(row["rows"])
        BACKLOG_AGE.labels(self._schema).set(max(0.0, float(row["age"])))

    # ---- writing, inside the caller's transaction --------------------------------------------
    async def add(self, conn: AsyncConnection[Any], topic: Topic, key: bytes, value: bytes | None) -> int:
        """Queue an event inside the caller's transaction (the pool gives dict rows); its commit
        wakes every replica's relay (NOTIFY is delivered on commit, once per transaction)."""
        cur = await conn.execute(
            sql.SQL(
                "WITH added AS (INSERT INTO {} (topic, key, value) VALUES (%s, %s, %s) RETURNING seq) "
                "SELECT seq, pg_notify(%s, '') FROM added"
            ).format(self._table),
            (topic.name, key, value, self._channel),
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row["seq"])

    # ---- lifecycle ---------------------------------------------------------------------------
    async def open(self) -> None:
        """The producer alone, for a one-shot command that publishes what it committed
        (`publish_committed`) and stops: no relay loop, no LISTEN connection, no pruner."""
        self._producer = await self._new_producer()

    async def start(self) -> None:
        await self.open()
        self._tasks = [
            asyncio.create_task(self._run(), name=f"relay:{self._lock_name}"),
            asyncio.create_task(self._listen(), name=f"relay-listen:{self._lock_name}"),
        ]
        await self._pruner.start()
        try:
            await self.export_backlog()  # on /metrics from the start
        except Exception:
            log.warning("reading %s's outbox backlog failed; trying again later", self._schema, exc_info=True)
        await self._backlog.start()

    async def stop(self) -> None:
        await self._backlog.stop()
        await self._pruner.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._producer is not None:
            await self._producer.stop()

    def wake(self) -> None:
        self._wake.set()

    async def _listen(self) -> None:
        """Wake the relay on every commit that added rows to this outbox, in any process."""
        while True:
            try:
                async with await AsyncConnection.connect(self._settings.database_url, autocommit=True, connect_timeout=3) as conn:
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
                    self._wake.set()  # rows committed while nobody listened
                    while True:
                        # What `conn.notifies()` runs, without its 0.1 s timer: the connection
                        # does nothing else, so there is no interrupt to look for (10 wake-ups a
                        # second per relay were most of an idle process's; BENCHMARKS.md, "idle").
                        # A closed socket is readable and ends the wait with an error.
                        await conn.wait(notifies(conn.pgconn), interval=LISTEN_CHECK_S)
                        self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception:  # Postgres away: the relay's own pass every `interval_s` goes on
                log.warning("outbox listener of %s lost Postgres; retrying", self._lock_name, exc_info=True)
            await asyncio.sleep(RETRY_S)

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self._interval)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.publish_committed()
            except asyncio.CancelledError:
                raise
            except Exception:  # Kafka or Postgres away: the rows wait in the table
                log.warning("outbox relay of %s failed; retrying", self._lock_name, exc_info=True)
                await asyncio.sleep(RETRY_S)
                self._wake.set()  # the rows are still there

    # ---- publishing --------------------------------------------------------------------------
    async def _new_producer(self) -> AIOKafkaProducer:
        producer = AIOKafkaProducer(bootstrap_servers=self._settings.kafka_bootstrap_servers, linger_ms=0, **PRODUCER_CONFIG)
        await producer.start()
        return producer

    async def publish_committed(self) -> None:
        """Publish every row committed before this call (the caller's own too). One pass that
        found less than a batch left none behind: rows another holder of the lock was sending
        are seen sent once it lets go, so a second pass would only cost a transaction."""
        while await self.flush() == self._batch:
            pass

    async def flush(self) -> int:
        """Publish every unsent row (up to one batch) in order; returns how many were sent."""
        if self._producer is None:
            raise RuntimeError("the outbox relay is not started")
        async with self._local, self._pool.connection() as conn:
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self._lock_name,))
            cur = await conn.execute(
                sql.SQL("SELECT seq, topic, key, value FROM {} WHERE sent_at IS NULL ORDER BY seq LIMIT %s").format(self._table),
                (self._batch,),
            )
            rows = await cur.fetchall()
            if not rows:
                return 0
            producer = self._producer  # taken under the lock: a flush before this one may have replaced it
            pending = [
                await producer.send(self._settings.topic(r["topic"]), value=_bytes(r["value"]), key=bytes(r["key"])) for r in rows
            ]
            # every ack, in order per partition (idempotent producer)
            failures = [r for r in await asyncio.gather(*pending, return_exceptions=True) if isinstance(r, BaseException)]
            if any(isinstance(failure, STALE_PRODUCER_ERRORS) for failure in failures):
                # the rows stay unsent and go again, in order, through a new producer
                log.warning("Kafka refused the %s relay's producer (sequence numbers); replacing it", self._lock_name)
                self._producer = await self._new_producer()
                retire(producer)
            if failures:
                raise failures[0]
            await conn.execute(
                sql.SQL("UPDATE {} SET sent_at = now() WHERE seq = ANY(%s)").format(self._table), ([r["seq"] for r in rows],)
            )
            return len(rows)
