"""Usage analytics against real Kafka and the real ClickHouse engine: the endpoints' numbers equal
an independent computation over the same generated events (several accounts, providers, models,
time zones, both autumn DST changes), with duplicates and malformed messages in the stream."""

import json
import random
import tomllib
import uuid
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from zoneinfo import ZoneInfo

import pytest
from aiokafka import AIOKafkaConsumer

from contracts.common import Resource
from contracts.events import UsageEvent
from contracts.topics import USAGE, dead_letter
from tests.support.apps import running_app
from tests.support.metering import publish_all, sign_in, wait_until
from tests.support.service_tokens import operator_service_headers

pytestmark = pytest.mark.integration

PRICES = """
currency = "EUR"
[[prices]]
provider = "openai"
model = "gpt-4o"
input_per_1m = "2.50"
output_per_1m = "10.00"
effective_from = 2024-01-01
[[prices]]
provider = "openai"
model = "gpt-4o"
input_per_1m = "2.00"
output_per_1m = "8.00"
effective_from = 2026-10-28
[[prices]]
provider = "anthropic"
model = "claude-sonnet-4"
input_per_1m = "3.00"
output_per_1m = "15.00"
effective_from = 2025-01-01
[[prices]]
provider = "google"
model = "gemini-2.5-flash"
input_per_1m = "0.30"
output_per_1m = "2.50"
effective_from = 2025-01-01
"""
MODELS = [("openai", "gpt-4o"), ("anthropic", "claude-sonnet-4"), ("google", "gemini-2.5-flash"), ("acme", "x-1")]
# Europe/Berlin falls back on 2026-10-25 01:00Z, America/New_York on 2026-11-01 06:00Z.
WINDOW = (datetime(2026, 10, 10, tzinfo=UTC), datetime(2026, 11, 8, tzinfo=UTC))
Q6 = Decimal("0.000001")


# ---- the independent computation ---------------------------------------------------------------
def price_of(provider: str, model: str, day: date) -> tuple[Decimal, Decimal] | None:
    best = None
    for row in tomllib.loads(PRICES)["prices"]:
        if (row["provider"], row["model"]) == (provider, model) and row["effective_from"] <= day:
            if best is None or row["effective_from"] > best["effective_from"]:
                best = row
    return (Decimal(best["input_per_1m"]), Decimal(best["output_per_1m"])) if best else None


def tokens(e: UsageEvent) -> tuple[int, int, int]:
    i, o = e.input_tokens or 0, e.output_tokens or 0
    total = i + o if (e.input_tokens is not None or e.output_tokens is not None) else e.quantity
    return i, o, total


def cost(e: UsageEvent) -> Decimal | None:
    """None for a model without a price on the event's day (v2: unpriced, never a silent 0)."""
    p = price_of(e.provider or "unknown", e.model or "unknown", e.time.astimezone(UTC).date())
    if p is None:
        return None
    i, o, _ = tokens(e)
    return (i * p[0] + o * p[1]) / Decimal(1_000_000)


def sums(events: list[UsageEvent]) -> dict:
    i = sum(tokens(e)[0] for e in events)
    o = sum(tokens(e)[1] for e in events)
    t = sum(tokens(e)[2] for e in events)
    c = sum((cost(e) or Decimal(0) for e in events), Decimal(0))
    unpriced = [e for e in events if cost(e) is None]
    return {
        "input_tokens": i,
        "output_tokens": o,
        "total_tokens": t,
        "calls": len(events),
        "cost": c,  # of the priced events
        "unpriced_tokens": sum(tokens(e)[2] for e in unpriced),
        "priced": not unpriced,
    }


def shown_cost(x: dict) -> str | None:
    """estimated_cost of a row: null when any of its usage has no price."""
    return money(x["cost"]) if x["priced"] else None


def money(d: Decimal) -> str:
    return str(d.quantize(Q6, rounding=ROUND_HALF_EVEN))


def pct2(x: Decimal) -> float:
    return float(x.quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN))


def change(cur, prev):
    if prev == 0:
        return 0.0 if cur == 0 else None
    return pct2((Decimal(cur) - Decimal(prev)) * 100 / Decimal(prev))


def in_range(events, account, start, end):
    return [e for e in events if e.account_id == account and e.resource == Resource.AI_TOKENS and start <= e.time < end]


def local_bucket(t: datetime, granularity: str, tz: ZoneInfo) -> datetime:
    if granularity == "hour":
        return t.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    d = t.astimezone(tz).date()
    if granularity == "week":
        d -= timedelta(days=d.weekday())
    return datetime(d.year, d.month, d.day, tzinfo=tz).astimezone(UTC)


# ---- generated events -----------------------------------------------------------------------------
def generate(accounts: list[uuid.UUID], rng: random.Random) -> list[UsageEvent]:
    events = []
    span = int((WINDOW[1] - WINDOW[0]).total_seconds())
    dst_moments = [datetime(2026, 10, 25, 1, tzinfo=UTC), datetime(2026, 11, 1, 6, tzinfo=UTC)]
    for n in range(1500):
        account = accounts[n % len(accounts)]
        if n % 10 == 0:  # crowd the hours around the DST changes
            t = rng.choice(dst_moments) + timedelta(seconds=rng.randint(-3 * 3600, 3 * 3600))
        else:
            t = WINDOW[0] + timedelta(seconds=rng.randrange(span))
        t = t.replace(microsecond=rng.randrange(1000) * 1000)
        provider, model = rng.choice(MODELS)
        kind = n % 17
        if kind == 0:  # not AI usage: excluded from the token analytics
            events.append(UsageEvent(time=t, account_id=account, resource=Resource.GEO_PROJECTS, quantity=1, source="geo"))
        elif kind == 1:  # no split: total is the quantity; no provider: "unknown"
            events.append(
                UsageEvent(time=t, account_id=account, resource=Resource.AI_TOKENS, quantity=rng.randint(1, 5000), source="t")
            )
        else:
            i, o = rng.randint(0, 20000), rng.randint(0, 8000)
            events.append(
                UsageEvent(
                    time=t,
                    account_id=account,
                    resource=Resource.AI_TOKENS,
                    quantity=i + o,
                    provider=provider,
                    model=model,
                    input_tokens=i,
                    output_tokens=o,
                    source="t",
                )
            )
    return events


def key(e) -> bytes:
    return str(e.account_id).encode()


async def test_analytics_equal_an_independent_computation(settings, tmp_path):
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES)
    settings = settings.model_copy(update={"metering_prices_file": str(prices)})
    rng = random.Random(4)
    async with running_app(settings, targets=("metering",)) as (app, client):
        broker = app.state.runtime.broker
        topic = settings.topic(USAGE.name)
        signed = [await sign_in(app) for _ in range(3)]
        accounts = [a for a, _ in signed]
        events = generate(accounts, rng)
        now = datetime.now(UTC)
        # Today's events for the calendar ranges (their expectations use the real clock too).
        for n in range(30):
            events.append(
                UsageEvent(
                    time=now - timedelta(minutes=n * 7),
                    account_id=accounts[0],
                    resource=Resource.AI_TOKENS,
                    quantity=100 + n,
                    provider="openai",
                    model="gpt-4o",
                    input_tokens=60 + n,
                    output_tokens=40,
                    source="t",
                )
            )
        # HTTP judges an event's time against now (at most 35 days back): only recent events can
        # take that way; the rest are history, published as a backfill would (record time = event time).
        recent = [e for e in events if e.time > now - timedelta(days=34)]
        via_http = recent[:200]
        http_ids = {e.id for e in via_http}
        direct = [e for e in events if e.id not in http_ids]
        await publish_all(broker, topic, direct, key, stamped=True)
        # Through the HTTP ingestion: 100 per call; a platform service's token may report any account.
        service = await operator_service_headers(app)
        for i in range(0, len(via_http), 100):
            chunk = [e.model_dump(mode="json") for e in via_http[i : i + 100]]
            r = await client.post("/api/usage/events", headers=service, json={"events": chunk})
            assert r.status_code == 202, r.text
            assert r.json() == {"accepted": len(chunk), "duplicates": 0}
        # Duplicates: again through HTTP (counted as such), and straight into Kafka after the
        # first copies were written and committed (a republish "minutes later").
        again = [e.model_dump(mode="json") for e in via_http[:50]]
        r = await client.post("/api/usage/events", headers=service, json={"events": again + again[:5]})
        assert r.json() == {"accepted": 0, "duplicates": len(again) + 5}
        # A customer never writes its meter, not even its own account's (v2: service tokens only).
        _own_account, own_headers = signed[1]
        for target in (accounts[0], accounts[1]):
            foreign = via_http[0].model_copy(update={"id": uuid.uuid4(), "account_id": target})
            r = await client.post("/api/usage/events", headers=own_headers, json={"events": [foreign.model_dump(mode="json")]})
            assert r.status_code == 403 and r.json()["error"]["code"] == "permission_denied"

        # Malformed messages go to the dead-letter topic; the sink keeps going.
        await broker.publish(b"{not json", topic, key=key(events[0]))
        await broker.publish(json.dumps({"id": str(uuid.uuid4()), "type": "usage"}).encode(), topic, key=key(events[0]))

        async def all_visible():
            ok = True
            for account, headers in signed:
                r = await client.get(
                    "/api/ai/usage/overview",
                    params={"range": "custom", "start": "2026-01-01T00:00:00Z", "end": "2027-01-01T00:00:00Z"},
                    headers=headers,
                )
                want = len([e for e in events if e.account_id == account and e.resource == Resource.AI_TOKENS])
                ok = ok and r.json()["calls"] == want
            return ok

        await wait_until(all_visible, timeout=60)
        await publish_all(broker, topic, direct[:300], key, stamped=True)  # republished long after
        sentinels = [
            UsageEvent(time=datetime(2026, 2, 1, tzinfo=UTC), account_id=a, resource=Resource.AI_TOKENS, quantity=1, source="s")
            for a in accounts
        ]
        await publish_all(broker, topic, sentinels, key, stamped=True)  # same partitions, after the republished copies
        events += sentinels
        await wait_until(all_visible, timeout=60)

        # ---- custom ranges in several zones, across the DST changes --------------------------
        for (account, headers), tz_name in zip(signed, ["Europe/Berlin", "America/New_York", "UTC"], strict=True):
            tz = ZoneInfo(tz_name)
            start = datetime(2026, 10, 20, tzinfo=tz)
            end = datetime(2026, 11, 6, tzinfo=tz)
            params = {"range": "custom", "start": start.isoformat(), "end": end.isoformat(), "tz": tz_name}
            # The previous span has the same duration (in real hours: aware datetimes of one zone subtract as wall clocks).
            span = end.astimezone(UTC) - start.astimezone(UTC)
            await check_overview(client, headers, params, events, account, start, end, start.astimezone(UTC) - span, 17)
            await check_by_provider(client, headers, params, events, account, start, end)
            for granularity in ("hour", "day", "week"):
                await check_trend(client, headers, params, events, account, start, end, tz, granularity, None, None)
            await check_trend(client, headers, params, events, account, start, end, tz, "day", "model", None)
            await check_trend(client, headers, params, events, account, start, end, tz, "hour", "provider", None)
            await check_trend(client, headers, params, events, account, start, end, tz, "day", "model", ["openai/gpt-4o", "nope"])

        # ---- calendar ranges with the real clock ------------------------------------------------
        account, headers = signed[0]
        for tz_name in ("America/New_York", "Asia/Tokyo"):
            tz = ZoneInfo(tz_name)
            today = datetime.now(tz).date()
            start = datetime(today.year, today.month, today.day, tzinfo=tz)
            end = datetime.combine(today + timedelta(days=1), datetime.min.time(), tzinfo=tz)
            params = {"range": "today", "tz": tz_name}
            prev_start = datetime.combine(today - timedelta(days=1), datetime.min.time(), tzinfo=tz)
            await check_overview(client, headers, params, events, account, start, end, prev_start, 1, elapsed(prev_start, start))
            first = today.replace(day=1)
            m_start = datetime(first.year, first.month, 1, tzinfo=tz)
            nxt = (first + timedelta(days=32)).replace(day=1)
            m_end = datetime(nxt.year, nxt.month, 1, tzinfo=tz)
            prev = (first - timedelta(days=1)).replace(day=1)
            await check_overview(
                client,
                headers,
                {"range": "month", "tz": tz_name},
                events,
                account,
                m_start,
                m_end,
                datetime(prev.year, prev.month, 1, tzinfo=tz),
                today.day,
                elapsed(datetime(prev.year, prev.month, 1, tzinfo=tz), m_start),
            )

        # ---- isolation and validation -------------------------------------------------------------
        _, stranger = await sign_in(app)
        r = await client.get("/api/ai/usage/by-provider", params={"range": "month"}, headers=stranger)
        assert r.status_code == 200 and r.json()["items"] == []
        _, no_roles = await sign_in(app, roles=[])
        assert (await client.get("/api/ai/usage/overview", headers=no_roles)).json()["error"]["code"] == "permission_denied"
        assert (await client.get("/api/ai/usage/overview")).status_code == 401
        for bad in (
            {"range": "year"},
            {"range": "custom"},
            {"range": "custom", "start": "2026-11-02T00:00:00Z", "end": "2026-11-01T00:00:00Z"},
            {"tz": "Mars/Olympus"},
            {"granularity": "minute"},
            {"keys": "a,b"},
            {"group_by": "model", "keys": ",".join(f"k{i}" for i in range(51))},  # at most 50 named series
            {"group_by": "model", "granularity": "hour", "keys": ",".join(f"k{i}" for i in range(11))}
            | {"range": "custom", "start": "2025-10-01T00:00:00Z", "end": "2026-11-01T00:00:00Z"},  # x 9504 h
        ):
            for accept in ("application/json", "text/csv"):  # the export is judged before its first line
                r = await client.get("/api/ai/usage/trend", params=bad, headers={**headers, "Accept": accept})
                assert r.status_code == 422 and r.json()["error"]["code"] == "validation_error", (bad, r.text)

        dead = await read_topic(settings, settings.topic(dead_letter(USAGE).name), 2)
        assert next(m.value for m in dead) == b"{not json"
        assert all(dict(m.headers).get("x-error") for m in dead)


def elapsed(prev_start: datetime, start: datetime) -> datetime:
    """Where the previous period's compared span ends: as many whole hours after its start as have
    elapsed of the current period (the running hour counted), never past the current start."""
    now = datetime.now(UTC)
    hours = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    return min(prev_start + (hours - start), start)


async def check_overview(client, headers, params, events, account, start, end, prev_start, days, prev_end=None):
    """`prev_end`: where the compared previous span ends (v2: the same elapsed span), else `start`."""
    prev_end = prev_end or start
    r = await client.get("/api/ai/usage/overview", params=params, headers=headers)
    assert r.status_code == 200, r.text
    got = r.json()
    cur = sums(in_range(events, account, start, end))
    prev = sums(in_range(events, account, prev_start, prev_end))
    per_model = defaultdict(list)
    for e in in_range(events, account, start, end):
        per_model[(e.provider or "unknown", e.model or "unknown")].append(e)
    models = sorted(((p, m, sums(es)) for (p, m), es in per_model.items()), key=lambda x: (-x[2]["total_tokens"], (x[0], x[1])))
    assert datetime.fromisoformat(got["range"]["start"]) == start
    assert datetime.fromisoformat(got["range"]["end"]) == end
    expected = {
        "input_tokens": cur["input_tokens"],
        "output_tokens": cur["output_tokens"],
        "total_tokens": cur["total_tokens"],
        "calls": cur["calls"],
        "estimated_cost": money(cur["cost"]),
        "currency": "EUR",
        "daily_average_tokens": pct2(Decimal(cur["total_tokens"]) / days),
        "previous": {
            "total_tokens": prev["total_tokens"],
            "calls": prev["calls"],
            "estimated_cost": money(prev["cost"]),
            "unpriced_tokens": prev["unpriced_tokens"],
            "range": got["previous"]["range"],  # checked below
        },
        "change_pct": {
            "total_tokens": change(cur["total_tokens"], prev["total_tokens"]),
            "calls": change(cur["calls"], prev["calls"]),
            "estimated_cost": change(cur["cost"], prev["cost"]),
        },
        "models": [
            {
                "provider": p,
                "model": m,
                "total_tokens": x["total_tokens"],
                "share_pct": pct2(Decimal(x["total_tokens"]) * 100 / cur["total_tokens"]),
                "estimated_cost": shown_cost(x),
                "priced": x["priced"],
            }
            for p, m, x in models
        ],
        "unpriced_tokens": cur["unpriced_tokens"],
    }
    assert cur["calls"] > 0 or params.get("range") != "custom"
    assert {k: v for k, v in got.items() if k != "range"} == expected
    assert datetime.fromisoformat(got["previous"]["range"]["start"]) == prev_start
    assert datetime.fromisoformat(got["previous"]["range"]["end"]) == prev_end
    return got


async def check_by_provider(client, headers, params, events, account, start, end):
    r = await client.get("/api/ai/usage/by-provider", params=params, headers=headers)
    per_model = defaultdict(list)
    for e in in_range(events, account, start, end):
        per_model[(e.provider or "unknown", e.model or "unknown")].append(e)
    want = {
        (p, m): {
            "calls": len(es),
            "total_tokens": sums(es)["total_tokens"],
            "estimated_cost": shown_cost(sums(es)),
            "priced": sums(es)["priced"],
        }
        for (p, m), es in per_model.items()
    }
    keys = ("calls", "total_tokens", "estimated_cost", "priced")
    got = {(i["provider"], i["model"]): {k: i[k] for k in keys} for i in r.json()["items"]}
    assert got == want and len(got) >= 4
    assert {i["priced"] for i in r.json()["items"]} == {True, False}  # acme/x-1 and unknown have no price


async def check_trend(client, headers, params, events, account, start, end, tz, granularity, group_by, keys):
    q = dict(params, granularity=granularity)
    if group_by:
        q["group_by"] = group_by
    if keys:
        q["keys"] = ",".join(keys)
    r = await client.get("/api/ai/usage/trend", params=q, headers=headers)
    assert r.status_code == 200, r.text
    body = r.json()
    # Every bucket of the range, in order.
    first = local_bucket(start, granularity, tz)
    expected_buckets = []
    t = first
    while t < end:
        expected_buckets.append(t)
        if granularity == "hour":
            t += timedelta(hours=1)
        else:
            local = t.astimezone(tz).date() + timedelta(days=1 if granularity == "day" else 7)
            t = datetime(local.year, local.month, local.day, tzinfo=tz).astimezone(UTC)
    grouped = defaultdict(lambda: defaultdict(list))
    for e in in_range(events, account, start, end):
        provider, model = e.provider or "unknown", e.model or "unknown"
        k = {"model": f"{provider}/{model}", "provider": provider, None: "total"}[group_by]
        grouped[k][local_bucket(e.time, granularity, tz)].append(e)
    series_keys = keys or sorted(grouped)
    assert [s["key"] for s in body["series"]] == series_keys
    for s in body["series"]:
        assert [datetime.fromisoformat(p["t"]) for p in s["points"]] == expected_buckets
        for p in s["points"]:
            want = sums(grouped[s["key"]].get(datetime.fromisoformat(p["t"]), []))
            assert (p["input_tokens"], p["output_tokens"], p["total_tokens"], p["calls"], p["estimated_cost"], p["priced"]) == (
                want["input_tokens"],
                want["output_tokens"],
                want["total_tokens"],
                want["calls"],
                shown_cost(want),
                want["priced"],
            ), (granularity, s["key"], p["t"])
    newest = max(e.time for k, cells in grouped.items() if not keys or k in keys for es in cells.values() for e in es)
    newest = newest.replace(microsecond=newest.microsecond // 1000 * 1000)  # stored in ms
    assert body["as_of"] is not None and datetime.fromisoformat(body["as_of"]) == newest  # the newest event included
    if granularity == "hour" and tz.key == "Europe/Berlin":
        assert len(expected_buckets) == 17 * 24 + 1  # the autumn day has 25 hours


async def read_topic(settings, topic, count):
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=settings.kafka_bootstrap_servers, auto_offset_reset="earliest")
    await consumer.start()
    try:
        got = []

        async def more():
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                got.extend(records)
            return len(got) >= count

        await wait_until(more, timeout=30, interval=0)
        return got
    finally:
        await consumer.stop()
