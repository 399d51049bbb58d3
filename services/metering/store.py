"""Metering's ClickHouse adapter: migrations, de-duplicated batch inserts, rollup and log reads.

clickhouse-connect is synchronous (its HTTP calls release the GIL while they wait), so every
call runs in a worker thread. Clients are opened once at start:
one writer (the sink's inserts never queue behind an analytics query) and a small pool of
readers, each client used by one thread at a time, so concurrent API requests do not queue
behind one lock. Every query is parameterised (`{name:Type}` server-side binding).
"""

import asyncio
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import clickhouse_connect.common
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError

from services.metering import sink_tables
from services.metering.domain import Cursor, UsageRow
from services.metering.prices import PriceTable
from services.metering.sink_tables import SinkTable
from services.runtime import clickhouse

MIGRATIONS = Path(__file__).with_name("clickhouse")
READERS = 4
# Rollup reads touch a few granules: one thread each is faster than fanning out, and keeps
# the tail low when the machine is busy. No JIT: the engine compiles an expression the third
# time it sees it, which made one request in a hundred take 60-110 ms instead of 15 (measured
# in bench/metering.py); over a few thousand rows compiled code gains nothing.
SMALL_READ = "SETTINGS max_threads = 1, compile_expressions = 0, compile_aggregate_expressions = 0"
T = TypeVar("T")
Canonical = Callable[[bytes], bytes]  # an event's JSON -> the same event as its model serialises it


@dataclass(frozen=True, slots=True)
class InsertResult:
    inserted: int
    duplicates: int


@dataclass(frozen=True, slots=True)
class ActivityFilter:
    start: datetime | None = None
    end: datetime | None = None
    api_key_id: UUID | None = None
    ip: str | None = None


@dataclass(frozen=True, slots=True)
class CallRow:
    id: UUID
    time: datetime
    api_key_id: UUID
    method: str
    path: str
    status: int
    ip: str
    user_agent: str
    latency_ms: float


class _Guarded:
    """One client, used by one thread at a time."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.lock = threading.Lock()

    async def run(self, fn: Callable[[Client], T]) -> T:
        def call() -> T:
            with self.lock:
                return fn(self.client)

        return await asyncio.to_thread(call)

    def close(self) -> None:
        with self.lock:
            self.client.close()


class _Pool:
    """A few clients; a call takes a free one (or waits for one) in its worker thread."""

    def __init__(self, clients: list[Client]) -> None:
        self.clients = clients
        self._free: queue.SimpleQueue[Client] = queue.SimpleQueue()
        for client in clients:
            self._free.put(client)

    async def run(self, fn: Callable[[Client], T]) -> T:
        def call() -> T:
            client = self._free.get()
            try:
                return fn(client)
            finally:
                self._free.put(client)

        return await asyncio.to_thread(call)

    def close(self) -> None:
        for _ in self.clients:  # waits for the ones in use
            self._free.get().close()


def _utc(value: datetime) -> datetime:
    """A client may hand back naive datetimes for UTC columns; they are UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class MeteringStore:
    def __init__(self, dsn: str, database: str) -> None:
        self.dsn = dsn
        self.db = database
        self._writer: _Guarded | None = None
        self._reader: _Pool | None = None

    # ---- lifecycle -------------------------------------------------------------------------
    def open(self) -> None:
        """Connect and migrate (blocking: run in a thread). Idempotent."""
        if self._writer is not None:
            return
        # An HTTP client would otherwise pin one server session and refuse concurrent queries.
        clickhouse_connect.common.set_setting("autogenerate_session_id", False)
        writer = clickhouse.connect(self.dsn, session=True)  # the sink's staging tables live in its session
        clickhouse.apply_migrations(writer, self.db, MIGRATIONS)
        self._writer = _Guarded(writer)
        self._reader = _Pool([clickhouse.connect(self.dsn) for _ in range(READERS)])

    def close(self) -> None:
        for clients in (self._writer, self._reader):
            if clients is not None:
                clients.close()
        self._writer = self._reader = None

    @property
    def writer(self) -> _Guarded:
        if self._writer is None:
            raise RuntimeError("the metering store is not open")
        return self._writer

    @property
    def reader(self) -> _Pool:
        if self._reader is None:
            raise RuntimeError("the metering store is not open")
        return self._reader

    async def publish_prices(self, table: PriceTable) -> None:
        """Write the price table for analysts (`prices`, read through `usage_daily`): the same
        prices the API charges with. Rows are replaced by key; a row removed from the file stays."""
        rows = [[p.provider, p.model, p.effective_from, p.input_per_1m, p.output_per_1m, table.currency] for p in table.all()]
        columns = ["provider", "model", "effective_from", "input_per_1m", "output_per_1m", "currency"]
        if rows:
            await self.writer.run(lambda c: c.insert(f"{self.db}.prices", rows, column_names=columns))

    async def ping(self) -> bool:
        rows = await self.reader.run(lambda c: c.query("SELECT 1").result_rows)
        return rows == [(1,)]

    # ---- the sink's writes ----------------------------------------------------------------
    async def insert_usage(self, lines: list[bytes], canonical: Canonical) -> InsertResult:
        return await self.writer.run(lambda c: self._insert_new(c, sink_tables.USAGE, lines, canonical))

    async def insert_calls(self, lines: list[bytes], canonical: Canonical) -> InsertResult:
        return await self.writer.run(lambda c: self._insert_new(c, sink_tables.CALLS, lines, canonical))

    def _insert_new(self, client: Client, sink: SinkTable, lines: list[bytes], canonical: Canonical) -> InsertResult:
        """Write the events (one JSON document each) whose id is not in the table yet.

        All in the engine, in this writer's session: the batch goes into a temporary staging
        table, the ids already written are looked up there (a duplicate is the same event: same
        account, and the same hour, so the lookup reads only the granules of the batch's
        account-hours, however large the table grows), and one INSERT ... SELECT writes the rest,
        each id once. Its rows, rollup and all are committed part by part; if the process dies
        between parts, the redelivered batch finds the written ids and inserts only the others.
        """
        if not lines:  # every message of the batch was dead-lettered
            return InsertResult(0, 0)
        staging, known, table = f"{sink.table}_staging", f"{sink.table}_known", f"{self.db}.{sink.table}"
        for ddl in (f"{staging} ({sink.staging})", f"{known} (id UUID)"):
            client.command(f"CREATE TEMPORARY TABLE IF NOT EXISTS {ddl} ENGINE = Memory")
        client.command(f"TRUNCATE TABLE {staging}")
        client.command(f"TRUNCATE TABLE {known}")
        try:
            self._stage(client, staging, lines)
        except DatabaseError:
            # A form the contract accepts but the engine does not read (a UUID in braces, a
            # lower-case `t` in a time): stage the models' own serialisation instead.
            client.command(f"TRUNCATE TABLE {staging}")
            self._stage(client, staging, [canonical(line) for line in lines])
        client.command(
            f"INSERT INTO {known} SELECT id FROM {table} "
            f"WHERE (account_id, toStartOfHour(time)) IN (SELECT account_id, toStartOfHour(time) FROM {staging}) "
            f"AND id IN (SELECT id FROM {staging})"
        )
        total, fresh = client.query(f"SELECT count(), uniqExactIf(id, id NOT IN {known}) FROM {staging}").result_rows[0]
        if fresh:
            client.command(
                f"INSERT INTO {table} ({sink.columns}) SELECT {sink.select} FROM {staging} WHERE id NOT IN {known} LIMIT 1 BY id"
            )
        return InsertResult(int(fresh), int(total) - int(fresh))

    @staticmethod
    def _stage(client: Client, staging: str, lines: list[bytes]) -> None:
        client.raw_insert(staging, None, insert_block=b"\n".join(lines), fmt="JSONEachRow", settings=sink_tables.JSON_INPUT)

    # ---- rollup reads -----------------------------------------------------------------------
    _SUMS = "provider, model, sum(events), sum(input_tokens), sum(output_tokens), sum(total_tokens)"

    async def usage_rows(self, account_id: UUID, start: datetime, end: datetime, *, per: str) -> list[UsageRow]:
        """ai_tokens sums from the hourly rollup in [start, end), per UTC `hour` or UTC `day`."""
        bucket = "hour" if per == "hour" else "toStartOfDay(hour)"
        sql = (
            f"SELECT toUnixTimestamp({bucket}) AS b, {self._SUMS} FROM {self.db}.usage_hourly "
            "WHERE account_id = {account:UUID} AND resource = 'ai_tokens' "
            "AND hour >= {start:DateTime('UTC')} AND hour < {end:DateTime('UTC')} "
            f"GROUP BY b, provider, model {SMALL_READ}"
        )
        params = {"account": account_id, "start": start, "end": end}
        rows = await self.reader.run(lambda c: c.query(sql, parameters=params).result_rows)
        return [_usage_row(row) for row in rows]

    async def daily_rows_split(
        self, account_id: UUID, start: datetime, split: datetime, end: datetime
    ) -> tuple[list[UsageRow], list[UsageRow]]:
        """Per UTC day sums of [start, split) and of [split, end), in one read of the rollup
        (the overview's previous and current period: one query instead of two)."""
        sql = (
            f"SELECT hour >= {{split:DateTime('UTC')}} AS current, toUnixTimestamp(toStartOfDay(hour)) AS b, {self._SUMS} "
            f"FROM {self.db}.usage_hourly "
            "WHERE account_id = {account:UUID} AND resource = 'ai_tokens' "
            "AND hour >= {start:DateTime('UTC')} AND hour < {end:DateTime('UTC')} "
            f"GROUP BY current, b, provider, model {SMALL_READ}"
        )
        params = {"account": account_id, "start": start, "split": split, "end": end}
        rows = await self.reader.run(lambda c: c.query(sql, parameters=params).result_rows)
        before = [_usage_row(row[1:]) for row in rows if not row[0]]
        after = [_usage_row(row[1:]) for row in rows if row[0]]
        return before, after

    # ---- activity log (raw calls, keyset pagination) ---------------------------------------------
    async def calls(self, account_id: UUID, where: ActivityFilter, limit: int, after: Cursor | None) -> list[CallRow]:
        """Newest first; `after` continues below the last (time, id) returned."""
        clauses = ["account_id = {account:UUID}"]
        params: dict[str, Any] = {"account": account_id, "limit": limit}
        if where.start is not None:
            clauses.append("time >= {start:DateTime64(6, 'UTC')}")
            params["start"] = where.start.astimezone(UTC)
        if where.end is not None:
            clauses.append("time < {end:DateTime64(6, 'UTC')}")
            params["end"] = where.end.astimezone(UTC)
        if where.api_key_id is not None:
            clauses.append("api_key_id = {key:UUID}")
            params["key"] = where.api_key_id
        if where.ip is not None:
            clauses.append("ip = {ip:String}")
            params["ip"] = where.ip
        if after is not None:
            clauses.append("(time, id) < ({ct:DateTime64(6, 'UTC')}, {cid:UUID})")
            params["ct"] = after.time
            params["cid"] = after.id
        # No FINAL (it would merge every row of the account before the LIMIT): the sink already
        # drops known ids, and a copy that slipped through (a rebalance race) sits next to its
        # twin in (time, id) order, so LIMIT 1 BY id drops it while the read stays in key order.
        sql = (
            "SELECT id, time, api_key_id, method, path, status, ip, user_agent, latency_ms "
            f"FROM {self.db}.call_events WHERE {' AND '.join(clauses)} "
            "ORDER BY time DESC, id DESC LIMIT 1 BY id LIMIT {limit:UInt32}"
        )
        rows = await self.reader.run(lambda c: c.query(sql, parameters=params).result_rows)
        return [CallRow(r[0], _utc(r[1]), r[2], r[3], r[4], int(r[5]), r[6], r[7], float(r[8])) for r in rows]


def _usage_row(row: Sequence[Any]) -> UsageRow:
    b, provider, model, n, i, o, t = row
    return UsageRow(datetime.fromtimestamp(b, UTC), provider, model, int(n), int(i), int(o), int(t))
