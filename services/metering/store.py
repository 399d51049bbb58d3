"""All of metering's SQL: the ClickHouse history (migrations, de-duplicated batch inserts, rollup
and log reads) and, in Postgres, the idempotency window of POST /api/usage/events.

clickhouse-connect is synchronous (its HTTP calls release the GIL while they wait), so every
call runs in a worker thread. Clients are opened once at start:
one writer (the sink's inserts never queue behind an analytics query) and a small pool of
readers, each client used by one thread at a time, so concurrent API requests do not queue
behind one lock. Every query is parameterised (`{name:Type}` server-side binding).
"""

import asyncio
import json
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar
from uuid import UUID

import clickhouse_connect.common
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError
from clickhouse_connect.driver.external import ExternalData
from clickhouse_connect.driver.summary import QuerySummary
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from contracts.events import UsageEvent
from contracts.quota_api import UNCOUNTED_CALLS
from services.metering import sink_tables
from services.metering.domain import NO_KEY, NO_KEY_SERIES, TOTAL_KEY, Cursor, GroupBy
from services.metering.prices import PriceTable
from services.metering.rollups import UsageRow
from services.metering.sink_tables import SinkTable
from services.runtime.platform import clickhouse

MIGRATIONS = Path(__file__).with_name("clickhouse")
READERS = 4
# Rollup reads touch a few granules: one thread each is faster than fanning out, and keeps
# the tail low when the machine is busy. No JIT: the engine compiles an expression the third
# time it sees it, which made one request in a hundred several times slower (BENCHMARKS.md,
# metering round 3, "Queries"); over a few thousand rows compiled code gains nothing.
SMALL_READ = "SETTINGS max_threads = 1, compile_expressions = 0, compile_aggregate_expressions = 0"
# The engine's refusal of an INSERT touching more partitions than max_partitions_per_insert_block.
TOO_MANY_PARTS = 252
STREAM_BLOCK_ROWS = 10_000  # rollup rows per block of a streamed read (an export holds one block at a time)
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
    status: int | None = None
    refused: bool | None = None  # (v2) outcome: True refused (has an error_code), False admitted


@dataclass(frozen=True, slots=True)
class UsageQuery:
    """ai_tokens of one account in [start, end) (whole UTC hours), of one key or of all;
    `per_key` keeps the keys apart (rows carry api_key_id)."""

    account_id: UUID
    start: datetime
    end: datetime
    api_key_id: UUID | None = None
    per_key: bool = False


def series_sql(group_by: GroupBy | None) -> str:
    """rollups.series_key in SQL: rows ordered by it come one trend series after another (the
    engine orders strings bytewise, as Python orders their code points)."""
    if group_by == "model":
        return "concat(provider, '/', model)"
    if group_by == "provider":
        return "toString(provider)"
    if group_by == "api_key":
        return f"if(api_key_id = toUUID('{NO_KEY}'), '{NO_KEY_SERIES}', toString(api_key_id))"
    return f"'{TOTAL_KEY}'"


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
    error_code: str | None = None  # (v2) None on an admitted call
    count: int = 1  # (v2) refused calls the edge folded into this one event
    service: str | None = None  # (v3) the platform service that verified it; None on Tollgate's routes
    # (v4) "usage": a usage event served on a model its key does not allow (method USAGE, path
    # `provider/model`, status 200), with what it used; None on calls
    kind: Literal["call", "usage"] = "call"
    provider: str | None = None
    model: str | None = None
    resource: str | None = None
    quantity: int | None = None


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

    def take(self) -> Client:
        """A free client (blocking: call in a worker thread); hand it back with give()."""
        return self._free.get()

    def give(self, client: Client) -> None:
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
        writer = clickhouse.connect(self.dsn)
        clickhouse.apply_migrations(writer, self.db, MIGRATIONS)
        self._writer = _Guarded(writer)
        # side by side: each connect asks the server a few things first (a tenth of a process's start)
        with ThreadPoolExecutor(READERS) as connecting:
            self._reader = _Pool(list(connecting.map(lambda _: clickhouse.connect(self.dsn), range(READERS))))

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
    async def insert_usage(
        self, lines: list[bytes], canonical: Canonical, flagged: frozenset[UUID] = frozenset()
    ) -> InsertResult:
        """(v4) `flagged`: the ids of the usage events whose key does not allow their model."""
        return await self.writer.run(lambda c: self._insert_new(c, sink_tables.USAGE, lines, canonical, flagged))

    async def insert_calls(
        self, lines: list[bytes], canonical: Canonical, flagged: frozenset[UUID] = frozenset()
    ) -> InsertResult:
        return await self.writer.run(lambda c: self._insert_new(c, sink_tables.CALLS, lines, canonical, flagged))

    def _insert_new(
        self, client: Client, sink: SinkTable, lines: list[bytes], canonical: Canonical, flagged: frozenset[UUID]
    ) -> InsertResult:
        """Write the events (one JSON document each) whose id is not in the table yet.

        One statement, all in the engine: the batch travels with the INSERT as an external
        table (`batch`, which the server parses once, for this query only). The ids already
        written are looked up on the primary key within the batch's own (account, hour) pairs (a
        duplicate is the same event: same account, same hour), so the lookup reads only those
        account-hours' granules, however large the table grows; the rest is written each id once.
        Its rows, rollup and all, are committed part by part; if the process dies between parts,
        the redelivered batch finds the written ids and inserts only the others. The engine's
        cost per statement is mostly fixed, and at a few calls a second a batch holds one or two
        events (BENCHMARKS.md, http_load round 14). A batch of more months than one INSERT may
        touch (a backfill) is written in several, by months (`_write_months`).
        """
        if not lines:  # every message of the batch was dead-lettered
            return InsertResult(0, 0)
        try:
            inserted = self._write_unseen(client, sink, lines, flagged)
        except DatabaseError as exc:
            # A form the contract accepts but the engine does not read (a UUID in braces, a
            # lower-case `t` in a time): send the models' own serialisation instead. Ids written
            # before a failure, if any, are found by the lookup.
            months = _by_month([canonical(line) for line in lines])
            if exc.code == TOO_MANY_PARTS and len(months) > 1:  # the batch itself was read
                inserted = self._write_halves(client, sink, months, flagged)
            else:
                inserted = self._write_months(client, sink, months, flagged)
        return InsertResult(inserted, len(lines) - inserted)

    def _write_months(self, client: Client, sink: SinkTable, months: list[list[bytes]], flagged: frozenset[UUID]) -> int:
        """The events of `months` in one INSERT or, if it would touch more monthly partitions than
        the engine lets one INSERT touch (`max_partitions_per_insert_block`, 100 by default: a
        backfill of years), in halves of the months. Each INSERT de-duplicates like a whole batch,
        so a process killed between two leaves a redelivery to write only what the rest held."""
        try:
            return self._write_unseen(client, sink, [line for month in months for line in month], flagged)
        except DatabaseError as exc:
            if exc.code != TOO_MANY_PARTS or len(months) < 2:
                raise
        return self._write_halves(client, sink, months, flagged)

    def _write_halves(self, client: Client, sink: SinkTable, months: list[list[bytes]], flagged: frozenset[UUID]) -> int:
        half = len(months) // 2
        return self._write_months(client, sink, months[:half], flagged) + self._write_months(client, sink, months[half:], flagged)

    def _write_unseen(self, client: Client, sink: SinkTable, lines: list[bytes], flagged: frozenset[UUID]) -> int:
        """The INSERT of the batch's unwritten ids; the number of rows it wrote."""
        table = f"{self.db}.{sink.table}"
        batch = ExternalData(file_name="batch", data=b"\n".join(lines), fmt="JSONEachRow", structure=sink.fields)
        written = (
            f"SELECT id FROM {table} WHERE (account_id, toStartOfHour(time)) IN "
            "(SELECT account_id, toStartOfHour(time) FROM batch) AND id IN (SELECT id FROM batch)"
        )
        summary = client.command(
            f"INSERT INTO {table} ({sink.columns}) SELECT {sink.select} FROM batch WHERE id NOT IN ({written}) LIMIT 1 BY id",
            parameters={"flagged": sorted(flagged)},
            external_data=batch,
            settings=sink_tables.JSON_INPUT,
        )
        if not isinstance(summary, QuerySummary):
            raise TypeError(f"an INSERT answered {summary!r}, not its summary")
        return summary.written_rows

    # ---- rollup reads -----------------------------------------------------------------------
    # Straight from usage_events, grouped and filtered on the `hourly` projection's own key
    # expressions, so the engine answers from the projection, never from the raw rows; through
    # the usage_hourly view, the same read cost ~4 ms more of query analysis (BENCHMARKS.md,
    # "metering at 100M events").
    _HOUR = "toStartOfHour(time)"
    _SUMS = (
        "provider, model, count() AS n, sum(input_tokens) AS i, sum(output_tokens) AS o, sum(total_tokens) AS t, "
        "toUnixTimestamp64Milli(max(time)) AS last"
    )

    def _where(self, q: UsageQuery, params: dict[str, Any]) -> str:
        params.update(account=q.account_id, start=q.start, end=q.end)
        where = (
            "account_id = {account:UUID} AND resource = 'ai_tokens' "
            f"AND {self._HOUR} >= {{start:DateTime('UTC')}} AND {self._HOUR} < {{end:DateTime('UTC')}}"
        )
        if q.api_key_id is not None:  # another account's key: the account filter already excludes it
            params["key"] = q.api_key_id
            where += " AND api_key_id = {key:UUID}"
        return where

    async def stream_usage(
        self,
        q: UsageQuery,
        *,
        per: str,
        group_by: GroupBy | None = None,
        keys: list[str] | None = None,
        at_once: bool = False,
    ) -> AsyncIterator[list[UsageRow]]:
        """ai_tokens sums per UTC `hour` or UTC `day` (x provider x model, x key when
        q.per_key), in blocks of at most STREAM_BLOCK_ROWS rows, never all at once.
        Ordered for the builders of domain: with `group_by` by trend series (in the order of
        `keys` when given, and only those), else by provider, model and key; then by time.
        `at_once`: the same rows read in one worker-thread call (a JSON answer holds them all
        anyway; one hand-off instead of one per block keeps the latency down)."""
        bucket = self._HOUR if per == "hour" else f"toStartOfDay({self._HOUR})"
        params: dict[str, Any] = {}
        where = self._where(q, params)
        key_col = ", api_key_id" if q.per_key or group_by == "api_key" else ""
        if keys:
            params["keys"] = keys
            where += f" AND {series_sql(group_by)} IN {{keys:Array(String)}}"
            order = f"indexOf({{keys:Array(String)}}, {series_sql(group_by)}), b"
        elif group_by is not None:
            order = f"{series_sql(group_by)}, b"
        else:
            order = f"provider, model{key_col}, b"
        sql = (
            f"SELECT toUnixTimestamp({bucket}) AS b, {self._SUMS}{key_col} FROM {self.db}.usage_events WHERE {where} "
            f"GROUP BY b, provider, model{key_col} ORDER BY {order}"
        )
        sql += f" {SMALL_READ}, max_block_size = {STREAM_BLOCK_ROWS}"
        if at_once:
            rows = await self.reader.run(lambda c: c.query(sql, parameters=params).result_rows)
            yield [_usage_row(row) for row in rows]
            return
        async for block in self._stream(sql, params):
            yield [_usage_row(row) for row in block]

    async def _stream(self, sql: str, params: dict[str, Any]) -> AsyncIterator[Sequence[Sequence[Any]]]:
        """The result of `sql` block by block, each fetched in a worker thread; one reader is
        held for the whole stream (and given back when the consumer stops early)."""
        pool = self.reader
        taking = asyncio.ensure_future(asyncio.to_thread(pool.take))
        try:
            client = await asyncio.shield(taking)
        except asyncio.CancelledError:  # the client the thread still takes goes back to the pool
            taking.add_done_callback(lambda t: None if t.cancelled() or t.exception() else pool.give(t.result()))
            raise
        context = None
        try:
            context = await asyncio.to_thread(lambda: client.query_row_block_stream(sql, parameters=params))
            blocks: Iterator[Sequence[Sequence[Any]]] = await asyncio.to_thread(context.__enter__)
            while (block := await asyncio.to_thread(next, blocks, None)) is not None:
                yield block
        finally:
            if context is not None:
                await asyncio.to_thread(context.__exit__, None, None, None)
            pool.give(client)

    async def daily_rows_split(self, q: UsageQuery, prev_end: datetime, split: datetime) -> tuple[list[UsageRow], list[UsageRow]]:
        """Per UTC day sums of [q.start, prev_end) and of [split, q.end), in one read of the rollup
        (the overview's previous and current period: one query instead of two). The hours between
        are read and dropped after grouping: an OR in the filter would make the engine weigh the
        raw rows' primary key with its slow generic search (12 ms more CPU per read at 100M events)."""
        params: dict[str, Any] = {"split": split, "prev_end": prev_end}
        where = self._where(q, params)
        hour = self._HOUR
        sql = (
            f"SELECT multiIf({hour} >= {{split:DateTime('UTC')}}, 1, {hour} < {{prev_end:DateTime('UTC')}}, 0, 2) AS period, "
            f"toUnixTimestamp(toStartOfDay({hour})) AS b, {self._SUMS} FROM {self.db}.usage_events WHERE {where} "
            f"GROUP BY period, b, provider, model HAVING period < 2 {SMALL_READ}"
        )
        rows = await self.reader.run(lambda c: c.query(sql, parameters=params).result_rows)
        before = [_usage_row(row[1:]) for row in rows if row[0] == 0]
        after = [_usage_row(row[1:]) for row in rows if row[0] == 1]
        return before, after

    # ---- (v4) keys' usage against their own limits ------------------------------------------------
    async def key_usage_since(
        self, account_id: UUID, key_ids: list[UUID], starts: list[datetime]
    ) -> dict[tuple[UUID, str, datetime], int]:
        """Each key's usage per resource since each start (a limit's window start): usage events'
        quantities, and `api_calls` as the admitted calls of the call log (the quota reads, which
        quota does not count, left out). Only `account_id`'s rows are read: a key id of another
        account matches nothing."""
        if not key_ids or not starts:
            return {}
        params: dict[str, Any] = {"account": account_id, "keys": key_ids}
        for i, start in enumerate(starts):
            params[f"s{i}"] = start.astimezone(UTC)
        since = ", ".join(f"sumIf(quantity, time >= {{s{i}:DateTime64(6, 'UTC')}})" for i in range(len(starts)))
        calls_since = ", ".join(f"sumIf(toInt64(count), time >= {{s{i}:DateTime64(6, 'UTC')}})" for i in range(len(starts)))
        # constants, not input; only Tollgate's own quota reads (service '') are free (counts_as_api_call)
        free_reads = ", ".join(f"('{method}', '{path}')" for method, path in sorted(UNCOUNTED_CALLS))
        sql = (
            f"SELECT api_key_id, resource, {since} FROM {self.db}.usage_events "
            "WHERE account_id = {account:UUID} AND api_key_id IN {keys:Array(UUID)} GROUP BY api_key_id, resource "
            f"UNION ALL SELECT api_key_id, 'api_calls', {calls_since} FROM {self.db}.call_events "
            "WHERE account_id = {account:UUID} AND api_key_id IN {keys:Array(UUID)} AND error_code = '' "
            f"AND NOT (service = '' AND (method, path) IN ({free_reads})) GROUP BY api_key_id"
        )
        rows = await self.reader.run(lambda c: c.query(sql, parameters=params).result_rows)
        used: dict[tuple[UUID, str, datetime], int] = {}
        for row in rows:
            for start, amount in zip(starts, row[2:], strict=True):
                key = (row[0], str(row[1]), start)
                used[key] = used.get(key, 0) + int(amount)
        return used

    # ---- activity log (raw calls and (v4) flagged usage, keyset pagination) ----------------------
    async def calls(self, account_id: UUID, where: ActivityFilter, limit: int, after: Cursor | None) -> list[CallRow]:
        """Newest first; `after` continues below the last (time, id) returned. (v4) The calls and the
        usage served on a model its key does not allow, in one (time, id) order: each source's
        newest `limit` (read in its key order), then the newest `limit` of both."""
        calls, usage, params = self._activity_sql(account_id, where, after)
        params["limit"] = limit
        top = " LIMIT {limit:UInt32}"
        sql = calls + top
        if usage is not None:
            sql = f"SELECT * FROM (({calls}{top}) UNION ALL ({usage}{top})) ORDER BY time DESC, id DESC{top}"
        rows = await self.reader.run(lambda c: c.query(sql, parameters=params).result_rows)
        return [_call_row(r) for r in rows]

    async def stream_calls(self, account_id: UUID, where: ActivityFilter) -> AsyncIterator[list[CallRow]]:
        """Every item of the filter, newest first, in blocks (the activity log's CSV export: no
        page limit, never held whole): `calls`' pages of STREAM_BLOCK_ROWS, one after the other by
        the keyset cursor. (v4) Pages rather than one streamed read: the calls and the flagged
        usage are two reads merged in one order, and a page holds a reader only while it is read
        (two streams held at once by each export could take every reader of the pool)."""
        after: Cursor | None = None
        while True:
            rows = await self.calls(account_id, where, STREAM_BLOCK_ROWS, after)
            if rows:
                yield rows
            if len(rows) < STREAM_BLOCK_ROWS:
                return
            after = Cursor(rows[-1].time, rows[-1].id)

    def _activity_sql(
        self, account_id: UUID, where: ActivityFilter, after: Cursor | None = None
    ) -> tuple[str, str | None, dict[str, Any]]:
        """The activity log's queries, each filtered, newest first, each id once: the calls, and
        (v4) the usage flagged `model_not_allowed` (None when a filter rules all usage out: it has
        no address, its status is 200, it was served)."""
        shared = ["account_id = {account:UUID}"]
        params: dict[str, Any] = {"account": account_id}
        for clause, name, value in (
            ("time >= {start:DateTime64(6, 'UTC')}", "start", where.start and where.start.astimezone(UTC)),
            ("time < {end:DateTime64(6, 'UTC')}", "end", where.end and where.end.astimezone(UTC)),
            ("api_key_id = {key:UUID}", "key", where.api_key_id),
        ):
            if value is not None:
                shared.append(clause)
                params[name] = value
        if after is not None:
            shared.append("(time, id) < ({ct:DateTime64(6, 'UTC')}, {cid:UUID})")
            params["ct"] = after.time
            params["cid"] = after.id
        calls = list(shared)
        if where.ip is not None:
            calls.append("ip = {ip:String}")
            params["ip"] = where.ip
        if where.status is not None:
            calls.append("status = {status:UInt16}")
            params["status"] = where.status
        if where.refused is not None:
            calls.append("error_code != ''" if where.refused else "error_code = ''")
        # No FINAL (it would merge every row of the account before the LIMIT): the sink already
        # drops known ids, and a copy that slipped through (a rebalance race) sits next to its
        # twin in (time, id) order, so LIMIT 1 BY id drops it while the read stays in key order.
        order = "ORDER BY time DESC, id DESC LIMIT 1 BY id"
        calls_sql = f"SELECT {_CALL_ITEM} FROM {self.db}.call_events WHERE {' AND '.join(calls)} {order}"
        if where.ip is not None or where.status not in (None, USAGE_STATUS) or where.refused:
            return calls_sql, None, params
        usage = [*shared, "model_not_allowed = 1"]  # (skip index: only granules holding flagged rows are read)
        usage_sql = f"SELECT {_USAGE_ITEM} FROM {self.db}.usage_events WHERE {' AND '.join(usage)} {order}"
        return calls_sql, usage_sql, params


# The activity log's items, one shape for both sources (the order of CallRow's fields). A usage
# item (v4) describes itself in the call's columns: method USAGE, path `provider/model`, status
# 200 (it was served), no address, user agent or latency.
USAGE_METHOD, USAGE_STATUS = "USAGE", 200
_CALL_ITEM = (
    "'call' AS kind, id, time, api_key_id, toString(method) AS method, path, status, ip, user_agent, latency_ms, "
    "toString(error_code) AS error_code, count, toString(service) AS service, "
    "'' AS provider, '' AS model, '' AS resource, toInt64(0) AS quantity"
)
_USAGE_ITEM = (
    f"'usage' AS kind, id, time, api_key_id, '{USAGE_METHOD}' AS method, concat(provider, '/', model) AS path, "
    f"toUInt16({USAGE_STATUS}) AS status, '' AS ip, '' AS user_agent, toFloat64(0) AS latency_ms, '' AS error_code, "
    "toUInt32(1) AS count, '' AS service, toString(provider) AS provider, toString(model) AS model, "
    "toString(resource) AS resource, quantity"
)


def _by_month(lines: list[bytes]) -> list[list[bytes]]:
    """The events (the models' own JSON) grouped by the UTC month of their time, the tables'
    partition, in month order, each id once (what the single INSERT's `LIMIT 1 BY id` did)."""
    months: dict[tuple[int, int], list[bytes]] = {}
    seen: set[str] = set()
    for line in lines:
        event = json.loads(line)
        if event["id"] in seen:
            continue
        seen.add(event["id"])
        time = datetime.fromisoformat(event["time"]).astimezone(UTC)
        months.setdefault((time.year, time.month), []).append(line)
    return [months[month] for month in sorted(months)]


def _call_row(r: Sequence[Any]) -> CallRow:
    kind, r = r[0], r[1:]
    error_code, count, service = r[9] or None, int(r[10]), r[11] or None
    row = CallRow(r[0], _utc(r[1]), r[2], r[3], r[4], int(r[5]), r[6], r[7], float(r[8]), error_code, count, service)
    if kind == "usage":
        return replace(row, kind="usage", provider=r[12], model=r[13], resource=r[14], quantity=int(r[15]))
    return row


def _usage_row(row: Sequence[Any]) -> UsageRow:
    b, provider, model, n, i, o, t, last = row[:8]
    key = row[8] if len(row) > 8 else None
    last_time = datetime.fromtimestamp(last / 1000, UTC) if last else None
    return UsageRow(datetime.fromtimestamp(b, UTC), provider, model, int(n), int(i), int(o), int(t), key, last_time)


# ---- Postgres: the idempotency window --------------------------------------------------------------
class IngestedIds:
    """The ids POST /api/usage/events accepted, in `metering.ingested_events`.

    The endpoint answers a re-sent id as a duplicate while the table holds it: at least
    USAGE_IDEMPOTENCY_WINDOW_SECONDS, at most one prune interval more (the pruner in app.py).
    After that the id is accepted and published again, and the sink still drops it as the same
    event (same id, account and hour; docs/clickhouse.md), as quota does (`quota.processed_events`).
    """

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool

    async def known(self, ids: list[UUID]) -> set[UUID]:
        async with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute("SELECT id FROM metering.ingested_events WHERE id = ANY(%s)", [ids])
            return {row["id"] for row in await cur.fetchall()}

    async def remember(self, events: list[UsageEvent]) -> int:
        """Record the events' ids; how many were not recorded yet (a concurrent request may have won)."""
        if not events:
            return 0
        async with self.pool.connection() as conn, conn.cursor() as cur:
            await cur.execute(
                "INSERT INTO metering.ingested_events (id, account_id) SELECT * FROM unnest(%s::uuid[], %s::uuid[]) "
                "ON CONFLICT (id) DO NOTHING RETURNING id",
                [[e.id for e in events], [e.account_id for e in events]],
            )
            return len(await cur.fetchall())
