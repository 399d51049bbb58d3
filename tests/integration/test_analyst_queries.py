"""docs/analysts.md is executable: every example query runs as the read-only `analyst` user on the
real ClickHouse server, in the real `tollgate` database layout (the metering store's own DDL and
sink), and its result is checked against known seeded events computed here in Python. The
queries are parsed out of the document, so the doc and the test cannot drift. And the analyst
cannot change anything: writes, DDL, SYSTEM, file()/url() and setting changes are refused."""

import asyncio
import math
import re
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import clickhouse_connect
import pytest
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError

from contracts.common import Resource
from contracts.events import CallEvent, UsageEvent
from services.metering import prices
from services.metering.store import MeteringStore
from tests.support.infra import Endpoints

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parents[2] / "docs" / "analysts.md"
DB = "tollgate"  # the analyst may read this database only
TITLES = [
    "Cost per model per day",
    "Top accounts by tokens",
    "Usage Tollgate cannot price",
    "Keys with unusual call rates",
    "Keys used from a new source IP",
    "p95 latency per route",
    "Refused calls per key",
    "Quota burn-down forecast",
    "Server error rate per route",
    "Busiest hour of the day",
    "Late arrivals",
    "Model mix",
    "Cost per account this month",
]


def doc_queries() -> list[tuple[str, str]]:
    return re.findall(r"^### \d+\. (.+?)\n```sql\n(.*?)```", DOC.read_text(), flags=re.S | re.M)


@dataclass
class Seed:
    now: datetime
    accounts: dict[str, uuid.UUID]
    keys: dict[str, uuid.UUID]
    usage: list[UsageEvent]
    calls: list[CallEvent]


def _usage(account, at, provider, model, inp, out) -> UsageEvent:
    return UsageEvent(
        time=at, account_id=account, resource=Resource.AI_TOKENS, quantity=inp + out,
        provider=provider, model=model, input_tokens=inp, output_tokens=out, source="analyst-doc",
    )  # fmt: skip


def _stock(account, at, resource, quantity) -> UsageEvent:
    """Usage of another resource than tokens: its `total_tokens` is its quantity in the views."""
    return UsageEvent(time=at, account_id=account, resource=resource, quantity=quantity, source="analyst-doc")


def tokens_of(seed: "Seed") -> list[UsageEvent]:
    return [e for e in seed.usage if e.resource == Resource.AI_TOKENS]


REFUSED = {401: "api_key_disabled", 403: "insufficient_quota", 429: "rate_limited"}  # the edge's codes
FLOOD = 3 * 1000  # the flooding key's refused calls, folded into 3 rows


def _call(account, key, at, method, path, status, ip, latency, count=1) -> CallEvent:
    return CallEvent(
        time=at, account_id=account, api_key_id=key, method=method, path=path, status=status, ip=ip, latency_ms=latency,
        error_code=REFUSED.get(status), count=count,
    )  # fmt: skip


def make_seed() -> Seed:
    now = datetime.now(UTC).replace(microsecond=0)
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    k1, k2, k3, k4 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    d = timedelta(days=1)
    usage = [_usage(a, now - 2 * d + timedelta(minutes=i), "openai", "gpt-4o", 1000, 500) for i in range(3)]
    usage += [_usage(a, now - d + timedelta(minutes=i), "openai", "gpt-4o", 1000, 500) for i in range(3)]
    usage += [_usage(a, now - d + timedelta(minutes=i), "openai", "gpt-4o-mini", 20_000, 10_000) for i in range(2)]
    usage += [_usage(a, now - timedelta(minutes=10), "openai", "gpt-4o", 100, 100)]  # arrives on time
    usage += [_usage(b, now - 3 * d, "openai", "o3", 100_000, 50_000)]
    usage += [_usage(b, now - d, "acme", "mystery-1", 700, 300)]  # no price
    usage += [_usage(c, now - 40 * d, "openai", "gpt-4o", 5, 5)]  # outside 30 days
    # Other resources: their quantities must never be added to tokens.
    usage += [_stock(a, now - timedelta(hours=2), Resource.GEO_PROJECTS, 1) for _ in range(3)]
    usage += [_stock(b, now - timedelta(hours=3), Resource.STORAGE_BYTES, 5_000_000)]
    geo, search = "/api/geo/projects", "/api/geo/search"
    calls = [_call(a, k1, now - timedelta(hours=h, minutes=30), "GET", geo, 200, "10.0.0.1", h % 50 + 1) for h in range(1, 167)]
    calls += [_call(a, k1, now - timedelta(minutes=30), "GET", geo, 200, "10.0.0.1", 7)]
    calls += [_call(a, k2, now - 3 * d + timedelta(minutes=i), "GET", search, 200, "10.0.0.2", 5) for i in range(3)]
    calls += [
        _call(a, k2, now - timedelta(minutes=i), "GET", search, 429 if i % 5 == 0 else 200, "10.9.9.9", 2.0 * i)
        for i in range(1, 51)
    ]
    k3_status = [500] * 4 + [403] * 2 + [201] * 14
    calls += [_call(b, k3, now - 2 * d + timedelta(minutes=i), "POST", geo, k3_status[i], "10.1.1.1", 100 + i) for i in range(20)]
    # A flood from a new address, refused and folded by the edge: 3 rows stand for 3,000 calls.
    calls += [_call(a, k4, now - timedelta(minutes=20 - i), "GET", search, 429, "10.7.7.7", 0.5, 1000) for i in range(3)]
    assert sum(c.count for c in calls if c.api_key_id == k4) == FLOOD
    return Seed(now, {"a": a, "b": b, "c": c}, {"k1": k1, "k2": k2, "k3": k3, "k4": k4}, usage, calls)


@pytest.fixture(scope="module")
async def seeded(infra: Endpoints) -> AsyncIterator[tuple[Seed, Client]]:
    if not infra.clickhouse_analyst_dsn:
        pytest.fail("set TEST_CLICKHOUSE_ANALYST_URL with TEST_CLICKHOUSE_URL (or let the test stack start ClickHouse)")
    admin = clickhouse_connect.get_client(dsn=infra.clickhouse_dsn)
    admin.command(f"DROP DATABASE IF EXISTS {DB}")  # the test server's own: a fresh layout each run
    store = MeteringStore(infra.clickhouse_dsn, DB)
    await asyncio.to_thread(store.open)
    seed = make_seed()
    await store.publish_prices(prices.load())
    same = lambda line: line  # noqa: E731
    await store.insert_usage([e.model_dump_json().encode() for e in seed.usage], same)
    await store.insert_calls([e.model_dump_json().encode() for e in seed.calls], same)
    store.close()
    analyst = clickhouse_connect.get_client(dsn=infra.clickhouse_analyst_dsn, database=DB)
    try:
        yield seed, analyst
    finally:
        analyst.close()
        admin.command(f"DROP DATABASE IF EXISTS {DB}")
        admin.close()


def _uuid_order(value: uuid.UUID) -> tuple[int, int]:
    """How ClickHouse orders UUIDs: by their last 64 bits, then their first 64 bits."""
    return value.int & (2**64 - 1), value.int >> 64


def _close(actual, expected, tolerance) -> bool:
    return abs(Decimal(str(actual)) - Decimal(str(expected))) <= Decimal(str(tolerance))


# ---- what each query must return, computed from the seed ---------------------------------------
def expect_cost_per_model_per_day(seed: Seed, rows) -> None:
    table = prices.load()
    tokens: Counter = Counter()
    split: dict = defaultdict(lambda: [0, 0])
    for e in tokens_of(seed):
        key = (e.time.date(), e.provider, e.model)
        tokens[key] += e.input_tokens + e.output_tokens
        split[key][0] += e.input_tokens
        split[key][1] += e.output_tokens
    assert [r[:4] for r in rows] == [(*k, tokens[k]) for k in sorted(tokens)]
    for day, provider, model, _, cost in rows:
        assert _close(cost, table.cost(provider, model, day, *split[(day, provider, model)]), "0.000001")
    assert any(r[4] > 0 for r in rows)


def expect_top_accounts(seed: Seed, rows) -> None:
    since = seed.now - timedelta(days=30)
    tokens: Counter = Counter()
    events: Counter = Counter()
    for e in tokens_of(seed):
        if e.time >= since:
            tokens[e.account_id] += e.input_tokens + e.output_tokens
            events[e.account_id] += 1
    assert rows == [(acc, t, events[acc]) for acc, t in tokens.most_common()]
    assert seed.accounts["c"] not in [r[0] for r in rows]


def expect_unpriced(seed: Seed, rows) -> None:
    assert rows == [("acme", "mystery-1", 1000, (seed.now - timedelta(days=1)).date())]


def expect_unusual_rates(seed: Seed, rows) -> None:
    window = (seed.now - timedelta(days=7, hours=1), seed.now - timedelta(hours=1))
    last: Counter = Counter()
    prior: Counter = Counter()
    for c in seed.calls:
        if c.time >= window[1]:
            last[(c.api_key_id, c.account_id)] += c.count
        elif c.time >= window[0]:
            prior[(c.api_key_id, c.account_id)] += c.count
    unusual = [(k, n, prior[k] / 168) for k, n in last.items() if n >= 10 and n > 5 * prior[k] / 168]
    expected = sorted(unusual, key=lambda x: -x[1])
    assert [(r[0], r[1], r[2]) for r in rows] == [(*k, n) for k, n, _ in expected]
    for row, (_, _, average) in zip(rows, expected, strict=True):
        assert _close(row[3], average, "0.0001")
    # the flood leads, with every call it stands for (counting rows would say 3, below the threshold)
    a = seed.accounts["a"]
    assert [r[:3] for r in rows] == [(seed.keys["k4"], a, FLOOD), (seed.keys["k2"], a, 50)]


def expect_new_ips(seed: Seed, rows) -> None:
    first: dict = {}
    calls: Counter = Counter()
    for c in seed.calls:
        first[(c.api_key_id, c.ip)] = min(first.get((c.api_key_id, c.ip), c.time), c.time)
        calls[(c.api_key_id, c.ip)] += c.count
    new = sorted((t, k) for k, t in first.items() if t >= seed.now - timedelta(days=1))
    assert [(r[0], r[1], r[2].replace(tzinfo=UTC), r[3]) for r in rows] == [(*k, t, calls[k]) for t, k in new]
    assert [(r[0], r[1], r[3]) for r in rows] == [(seed.keys["k2"], "10.9.9.9", 50), (seed.keys["k4"], "10.7.7.7", FLOOD)]


def expect_p95(seed: Seed, rows) -> None:
    groups: dict = defaultdict(list)
    for c in seed.calls:
        groups[(c.method, c.path)] += [c.latency_ms] * c.count  # a folded row is `count` calls
    expected = []
    for (method, path), values in sorted(groups.items()):
        ordered = sorted(values)
        # quantileExactWeighted's element: the first whose running weight reaches ceil(0.95 x calls)
        expected.append((method, path, len(values), ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]))
    assert rows == expected


def expect_refused(seed: Seed, rows) -> None:
    counted = Counter()
    for c in seed.calls:
        if c.error_code is not None:
            counted[(c.api_key_id, c.error_code)] += c.count
    assert sorted(rows, key=str) == sorted(((k, s, n) for (k, s), n in counted.items()), key=str)
    assert rows == sorted(rows, key=lambda r: (_uuid_order(r[0]), r[1]))
    assert sum(r[2] for r in rows) == 12 + FLOOD


def expect_burn_down(seed: Seed, rows) -> None:
    month_start = seed.now.replace(day=1, hour=0, minute=0, second=0)
    mtd: Counter = Counter()
    for e in tokens_of(seed):
        if e.time >= month_start:
            mtd[e.account_id] += e.input_tokens + e.output_tokens
    elapsed = (seed.now - month_start).total_seconds() / 86400
    next_month = (month_start + timedelta(days=32)).replace(day=1)
    days_in_month = (next_month - month_start).days
    assert {r[0]: r[1] for r in rows} == dict(mtd)
    for account, month_to_date, projected, until_limit in rows:
        assert abs(projected - month_to_date / elapsed * days_in_month) <= 0.02 * projected
        assert abs(until_limit - (1_000_000 - month_to_date) / (month_to_date / elapsed)) <= 0.02 * abs(until_limit) + 0.01
    assert rows == sorted(rows, key=lambda r: -r[2])


def expect_error_rate(seed: Seed, rows) -> None:
    assert rows[0][:3] == ("POST", "/api/geo/projects", 20) and _close(rows[0][3], 0.2, "0.000001")
    assert sorted(r[:3] for r in rows[1:]) == [("GET", "/api/geo/projects", 167), ("GET", "/api/geo/search", 53 + FLOOD)]
    assert all(r[3] == 0 for r in rows[1:])


def expect_busiest_hour(seed: Seed, rows) -> None:
    per: dict = defaultdict(Counter)
    for c in seed.calls:
        per[c.account_id][c.time.hour] += c.count
    expected = []
    for account in sorted(per, key=_uuid_order):
        hour, n = sorted(per[account].items(), key=lambda kv: (-kv[1], kv[0]))[0]
        expected.append((account, hour, n))
    assert rows == expected


def expect_late(seed: Seed, rows) -> None:
    late = Counter(e.time.date() for e in seed.usage if e.time < seed.now - timedelta(hours=1))
    assert [(r[0], r[1]) for r in rows] == sorted(late.items())
    assert sum(r[1] for r in rows) == len(seed.usage) - 1  # all but the one written 10 minutes after it happened
    for day, _, worst in rows:
        oldest = min(e.time for e in seed.usage if e.time.date() == day)
        assert worst >= (seed.now - oldest).total_seconds() - 1


def expect_model_mix(seed: Seed, rows) -> None:
    tokens: Counter = Counter()
    for e in tokens_of(seed):
        tokens[(e.account_id, e.provider, e.model)] += e.input_tokens + e.output_tokens
    per_account: Counter = Counter()
    for (account, _, _), t in tokens.items():
        per_account[account] += t
    expected = sorted(tokens.items(), key=lambda kv: (_uuid_order(kv[0][0]), -kv[1], kv[0][2]))
    assert [r[:4] for r in rows] == [(*k, t) for k, t in expected]
    for account, _, _, t, share in rows:
        assert _close(share, t / per_account[account], "0.000001")


def expect_cost_this_month(seed: Seed, rows) -> None:
    table = prices.load()
    month_start = seed.now.date().replace(day=1)
    cost: dict = defaultdict(Decimal)
    tokens: Counter = Counter()
    for e in tokens_of(seed):
        if e.time.date() >= month_start:
            cost[e.account_id] += table.cost(e.provider, e.model, e.time.date(), e.input_tokens, e.output_tokens)
            tokens[e.account_id] += e.input_tokens + e.output_tokens
    assert {r[0] for r in rows} == set(cost)
    for account, c, t in rows:
        assert _close(c, cost[account], "0.000001")
        assert t == tokens[account]  # tokens only: no GEO projects, no bytes


CHECKS = [
    expect_cost_per_model_per_day,
    expect_top_accounts,
    expect_unpriced,
    expect_unusual_rates,
    expect_new_ips,
    expect_p95,
    expect_refused,
    expect_burn_down,
    expect_error_rate,
    expect_busiest_hour,
    expect_late,
    expect_model_mix,
    expect_cost_this_month,
]


def test_the_doc_has_the_examples_this_test_checks():
    queries = doc_queries()
    assert len(queries) >= 12
    assert len(queries) == len(CHECKS)
    for (title, _), expected in zip(queries, TITLES, strict=True):
        assert title.startswith(expected), (title, expected)


@pytest.mark.parametrize("index", range(len(CHECKS)), ids=TITLES)
async def test_each_example_query_answers_its_question_as_analyst(seeded, index):
    seed, analyst = seeded
    title, sql = doc_queries()[index]
    rows = await asyncio.to_thread(lambda: analyst.query(sql).result_rows)
    assert rows, f"{title}: no rows"
    CHECKS[index](seed, [tuple(r) for r in rows])


def _normalize(rows):
    return [tuple(x.replace(tzinfo=UTC) if isinstance(x, datetime) else x for x in r) for r in rows]


@pytest.mark.parametrize(
    ("sql", "code"),
    [
        (f"INSERT INTO {DB}.usage_events (id, account_id) VALUES (generateUUIDv4(), generateUUIDv4())", "ACCESS_DENIED"),
        (f"INSERT INTO {DB}.prices (provider, model) VALUES ('x', 'y')", "ACCESS_DENIED"),
        (f"ALTER TABLE {DB}.usage_events DELETE WHERE 1", "ACCESS_DENIED"),
        (f"TRUNCATE TABLE {DB}.call_events", "ACCESS_DENIED"),
        (f"DROP TABLE {DB}.usage_events", "ACCESS_DENIED"),
        (f"CREATE TABLE {DB}.mine (n UInt8) ENGINE = Memory", "ACCESS_DENIED"),
        (f"CREATE VIEW {DB}.mine AS SELECT 1", "ACCESS_DENIED"),
        (f"SYSTEM STOP MERGES {DB}.usage_events", "ACCESS_DENIED"),
        ("SELECT * FROM file('/etc/passwd', 'LineAsString')", "ACCESS_DENIED"),
        ("SELECT * FROM url('http://127.0.0.1:1/', 'LineAsString')", "ACCESS_DENIED"),
        ("SELECT 1 SETTINGS readonly = 0", "READONLY"),
        ("SELECT 1 FORMAT Template SETTINGS format_template_resultset = '/etc/passwd'", "READONLY"),
        ("SELECT count() FROM system.numbers_mt LIMIT 1 SETTINGS max_execution_time = 100000", "READONLY"),
        ("SELECT * FROM system.users", "ACCESS_DENIED"),
    ],
)
async def test_the_analyst_cannot_change_anything(seeded, sql, code):
    seed, analyst = seeded
    before = _normalize(analyst.query(f"SELECT count(), sum(total_tokens), max(ingested_at) FROM {DB}.usage").result_rows)
    calls_before = analyst.query(f"SELECT count() FROM {DB}.api_calls").result_rows
    with pytest.raises(DatabaseError) as refused:
        await asyncio.to_thread(analyst.command, sql)
    assert code in str(refused.value), str(refused.value)  # the server's own refusal
    assert _normalize(analyst.query(f"SELECT count(), sum(total_tokens), max(ingested_at) FROM {DB}.usage").result_rows) == before
    assert analyst.query(f"SELECT count() FROM {DB}.api_calls").result_rows == calls_before
    assert before[0][0] == len(seed.usage)
