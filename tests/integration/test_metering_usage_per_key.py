"""Usage per API key, CSV export and honest numbers (issue 19, items 4, 5, 7) against real Kafka and
the real ClickHouse engine: filters and groups by key equal an independent computation, another
account's key matches nothing, CSV equals the JSON rows, unpriced usage is null (never a silent 0),
`as_of`, `previous` over the same elapsed span, and `provider/model` series keys."""

import csv
import hashlib
import io
import uuid
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

import pytest

from contracts.common import KeyStatus, Resource, Role
from contracts.events import CallEvent, KeyState, UsageEvent
from contracts.topics import CALLS, KEYS, USAGE
from services.metering import store as metering_store
from tests.support.apps import running_app
from tests.support.metering import publish_all, sign_in, wait_until

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
provider = "azure"
model = "gpt-4o"
input_per_1m = "3.00"
output_per_1m = "12.00"
effective_from = 2024-01-01
"""
PRICE = {("openai", "gpt-4o"): (Decimal("2.50"), Decimal("10.00")), ("azure", "gpt-4o"): (Decimal("3.00"), Decimal("12.00"))}
SECRET = "sk-" + "k1" * 24  # key 1's secret: the tests also call with it as a customer would
MASK = "sk-k1k1...k1k1"
HOUR = timedelta(hours=1)


def money(d: Decimal) -> str:
    return str(d.quantize(Decimal("0.000001"), rounding=ROUND_HALF_EVEN))


def expect(events: list[UsageEvent]) -> dict:
    """Totals as the contract states them: cost of priced usage, null when any is unpriced."""
    cost, unpriced = Decimal(0), 0
    for e in events:
        price = PRICE.get((e.provider, e.model))
        if price is None:
            unpriced += e.input_tokens + e.output_tokens
        else:
            cost += (e.input_tokens * price[0] + e.output_tokens * price[1]) / Decimal(1_000_000)
    priced = not any(PRICE.get((e.provider, e.model)) is None for e in events)
    return {
        "calls": len(events),
        "input_tokens": sum(e.input_tokens for e in events),
        "output_tokens": sum(e.output_tokens for e in events),
        "total_tokens": sum(e.input_tokens + e.output_tokens for e in events),
        "estimated_cost": money(cost) if priced else None,
        "priced": priced,
        "cost": money(cost),
        "unpriced_tokens": unpriced,
    }


def usage(t: datetime, account: uuid.UUID, key: uuid.UUID | None, provider: str, model: str, i: int, o: int) -> UsageEvent:
    return UsageEvent(
        time=t,
        account_id=account,
        resource=Resource.AI_TOKENS,
        quantity=i + o,
        provider=provider,
        model=model,
        input_tokens=i,
        output_tokens=o,
        source="t",
        api_key_id=key,
    )


def parse_csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def as_csv(value: object) -> str:
    """A JSON value as the CSV writes it."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


async def test_usage_per_key_csv_and_honest_numbers(settings, tmp_path, monkeypatch):
    prices = tmp_path / "prices.toml"
    prices.write_text(PRICES)
    settings = settings.model_copy(update={"metering_prices_file": str(prices)})
    # Small blocks: the CSV is written across many blocks of the engine's stream, and must still
    # equal the JSON (series and items that span a block boundary are not split or repeated).
    monkeypatch.setattr(metering_store, "STREAM_BLOCK_ROWS", 2)
    async with running_app(settings, targets=("metering",)) as (app, client):
        broker = app.state.runtime.broker
        (account, headers), (other, other_headers) = [await sign_in(app), await sign_in(app)]
        k1, k2, k3 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()  # k3 is the other account's
        await broker.publish(
            KeyState(
                time=datetime.now(UTC),
                account_id=account,
                key_id=k1,
                hash=hashlib.sha256(SECRET.encode()).hexdigest(),
                status=KeyStatus.ENABLED,
                roles=[Role.OWNER],
                masked_key=MASK,
            ),
            settings.topic(KEYS.name),
            key=str(k1).encode(),
        )
        now = datetime.now(UTC)
        # A custom range that runs into the future: 5 whole hours past, the running one, 2 to come.
        start = now.replace(minute=0, second=0, microsecond=0) - 5 * HOUR
        end = start + 8 * HOUR
        elapsed = now.replace(minute=0, second=0, microsecond=0) + HOUR - start
        prev_start = start - (end - start)
        current = [
            usage(start + 10 * timedelta(minutes=1), account, k1, "openai", "gpt-4o", 1000, 200),
            usage(start + HOUR + timedelta(minutes=5), account, k1, "openai", "gpt-4o", 3000, 100),
            usage(start + 2 * HOUR, account, k1, "azure", "gpt-4o", 500, 50),  # same model name, another provider
            usage(start + 2 * HOUR + timedelta(minutes=1), account, k2, "acme", "x-1", 7000, 700),  # no price
            usage(start + 3 * HOUR, account, k2, "openai", "gpt-4o", 10, 10),
            usage(now - timedelta(minutes=1), account, None, "openai", "gpt-4o", 40, 4),  # reported without a key
        ]
        previous_in = [usage(prev_start + HOUR, account, k1, "openai", "gpt-4o", 111, 11)]
        previous_after = [usage(prev_start + elapsed + HOUR, account, k1, "openai", "gpt-4o", 999, 99)]  # not yet elapsed
        strangers = [
            usage(start + HOUR, other, k3, "openai", "gpt-4o", 5, 5),
            # a platform service may name any key in the other account's usage: here the account's k1
            usage(start + HOUR, other, k1, "openai", "gpt-4o", 6, 6),
        ]
        events = current + previous_in + previous_after + strangers
        await publish_all(broker, settings.topic(USAGE.name), events, lambda e: str(e.account_id).encode())

        window = {"range": "custom", "start": start.isoformat(), "end": end.isoformat()}

        async def visible():
            got = []
            for h, n in ((headers, len(current)), (other_headers, len(strangers))):
                r = await client.get("/api/ai/usage/overview", params=window, headers=h)
                got.append(r.json()["calls"] == n)
            # and key 1 known to the edge (keys.v1), so it can call as a customer would
            r = await client.get("/api/ai/usage/overview", params=window, headers={"Authorization": f"Bearer {SECRET}"})
            return all(got) and r.status_code == 200

        await wait_until(visible, timeout=60)

        # ---- overview: filter by key, unpriced tokens, the same elapsed span --------------------
        async def overview(params, h=headers):
            r = await client.get("/api/ai/usage/overview", params=dict(window, **params), headers=h)
            assert r.status_code == 200, r.text
            return r.json()

        whole = await overview({})
        want = expect(current)
        assert (whole["calls"], whole["total_tokens"], whole["estimated_cost"], whole["unpriced_tokens"]) == (
            want["calls"],
            want["total_tokens"],
            want["cost"],  # the priced usage's cost ...
            7700,  # ... and how many tokens are not in it
        )
        models = {(m["provider"], m["model"]): (m["estimated_cost"], m["priced"]) for m in whole["models"]}
        assert models[("acme", "x-1")] == (None, False)
        assert models[("azure", "gpt-4o")] == (expect([current[2]])["estimated_cost"], True)
        # previous: the same 6 elapsed hours at the start of the previous 8, not the whole 8
        assert datetime.fromisoformat(whole["previous"]["range"]["start"]) == prev_start
        assert datetime.fromisoformat(whole["previous"]["range"]["end"]) == prev_start + elapsed
        assert (whole["previous"]["calls"], whole["previous"]["total_tokens"]) == (1, 122)
        assert whole["change_pct"]["calls"] == float(Decimal((len(current) - 1) * 100).quantize(Decimal("0.01")))

        by_k1 = await overview({"api_key_id": str(k1)})
        want = expect(current[:3])
        assert (by_k1["calls"], by_k1["input_tokens"], by_k1["estimated_cost"], by_k1["unpriced_tokens"]) == (
            3,
            want["input_tokens"],
            want["cost"],
            0,
        )
        assert by_k1["previous"]["calls"] == 1
        by_k2 = await overview({"api_key_id": str(k2)})
        assert (by_k2["calls"], by_k2["unpriced_tokens"], by_k2["estimated_cost"]) == (2, 7700, expect([current[4]])["cost"])
        # Another account's key matches nothing (and says nothing about it); the key's account sees it.
        foreign = await overview({"api_key_id": str(k3)})
        assert (foreign["calls"], foreign["total_tokens"], foreign["models"], foreign["previous"]["calls"]) == (0, 0, [], 0)
        assert (await overview({"api_key_id": str(k3)}, other_headers))["calls"] == 1

        # ---- by-provider: filter and group by key -------------------------------------------------
        async def by_provider(params, h=headers, accept="application/json"):
            r = await client.get("/api/ai/usage/by-provider", params=dict(window, **params), headers=dict(h, Accept=accept))
            assert r.status_code == 200, r.text
            return r

        grouped = (await by_provider({"group_by": "api_key"})).json()["items"]
        per_key = defaultdict(list)
        for e in current:
            per_key[(e.provider, e.model, str(e.api_key_id) if e.api_key_id else None)].append(e)
        assert {(i["provider"], i["model"], i["api_key_id"]): i for i in grouped} == {
            (p, m, k): {
                "provider": p,
                "model": m,
                "api_key_id": k,
                "masked_key": MASK if k == str(k1) else None,  # k2 was never seen on keys.v1
                **{f: expect(es)[f] for f in ("calls", "total_tokens", "estimated_cost", "priced")},
            }
            for (p, m, k), es in per_key.items()
        }
        only_k1 = (await by_provider({"api_key_id": str(k1)})).json()["items"]
        assert sorted((i["provider"], i["model"], i["calls"], i["api_key_id"]) for i in only_k1) == [
            ("azure", "gpt-4o", 1, None),
            ("openai", "gpt-4o", 2, None),
        ]
        assert (await by_provider({"api_key_id": str(k3)})).json()["items"] == []
        # The other account sees the key id its usage named, never the account's mask of k1.
        theirs = (await by_provider({"group_by": "api_key"}, other_headers)).json()["items"]
        assert sorted((i["api_key_id"], i["masked_key"]) for i in theirs) == sorted([(str(k3), None), (str(k1), None)])
        # As a customer would, with the API key itself (a read: no usage is recorded for it).
        r = await client.get(
            "/api/ai/usage/by-provider", params=dict(window, group_by="api_key"), headers={"Authorization": f"Bearer {SECRET}"}
        )
        assert r.status_code == 200 and r.json()["items"] == grouped

        # CSV: the same rows with the same columns as the JSON items (the key's empty when not grouped
        # by it), streamed (ordered by provider, model, key).
        header = ["provider", "model", "api_key_id", "masked_key", "calls", "total_tokens", "estimated_cost", "priced"]
        for params in ({"group_by": "api_key"}, {}, {"api_key_id": str(k2)}):
            json_items = (await by_provider(params)).json()["items"]
            assert all(set(i) == set(header) for i in json_items)
            r = await by_provider(params, accept="text/csv")
            assert r.headers["content-type"].startswith("text/csv")
            rows = parse_csv(r.text)
            assert r.text.splitlines()[0] == ",".join(header)
            # The same rows (the CSV comes in the stream's order: provider, model, key as the engine orders UUIDs).
            assert sorted([row[c] for c in header] for row in rows) == sorted([as_csv(i[c]) for c in header] for i in json_items)
            assert len(rows) == len(json_items) > 0

        # ---- trend: group by key, provider/model keys, unpriced points, as_of, CSV ------------------
        async def trend(params, accept="application/json"):
            q = dict(window, granularity="hour", **params)
            r = await client.get("/api/ai/usage/trend", params=q, headers=dict(headers, Accept=accept))
            assert r.status_code == 200, r.text
            return r

        hours = [start + n * HOUR for n in range(8)]

        def series_of(key_fn, selected=current):
            out = defaultdict(lambda: defaultdict(list))
            for e in selected:
                out[key_fn(e)][e.time.replace(minute=0, second=0, microsecond=0)].append(e)
            return out

        for group_by, key_fn in (
            ("api_key", lambda e: str(e.api_key_id) if e.api_key_id else "none"),
            ("model", lambda e: f"{e.provider}/{e.model}"),
            (None, lambda e: "total"),
        ):
            params = {"group_by": group_by} if group_by else {}
            body = (await trend(params)).json()
            want = series_of(key_fn)
            assert [s["key"] for s in body["series"]] == sorted(want)
            for s in body["series"]:
                assert [datetime.fromisoformat(p["t"]) for p in s["points"]] == hours
                for p in s["points"]:
                    w = expect(want[s["key"]].get(datetime.fromisoformat(p["t"]), []))
                    fields = ("calls", "input_tokens", "output_tokens", "total_tokens", "estimated_cost", "priced")
                    got = {f: p[f] for f in fields}
                    assert got == {f: w[f] for f in got}, (group_by, s["key"], p["t"])
            newest = max(e.time for e in current)
            assert datetime.fromisoformat(body["as_of"]) == newest.replace(microsecond=newest.microsecond // 1000 * 1000)
            # CSV: every point of every series, in the same order.
            r = await trend(params, accept="text/csv")
            rows = parse_csv(r.text)
            fields = ["input_tokens", "output_tokens", "total_tokens", "calls", "estimated_cost", "priced"]
            assert [[row["key"], datetime.fromisoformat(row["t"])] + [row[f] for f in fields] for row in rows] == [
                [s["key"], datetime.fromisoformat(p["t"])] + [as_csv(p[f]) for f in fields]
                for s in body["series"]
                for p in s["points"]
            ]
            assert len(rows) == 8 * len(body["series"])
        model_keys = [s["key"] for s in (await trend({"group_by": "model"})).json()["series"]]
        assert model_keys == ["acme/x-1", "azure/gpt-4o", "openai/gpt-4o"]  # two providers' gpt-4o stay apart
        total = (await trend({}, "application/json")).json()["series"][0]["points"]
        assert [p["priced"] for p in total][2] is False and total[2]["estimated_cost"] is None  # acme's hour
        assert total[3]["priced"] is True and total[3]["estimated_cost"] == expect([current[4]])["cost"]

        # Filter and group together; keys in a chosen order (and one that matched nothing).
        body = (await trend({"group_by": "api_key", "api_key_id": str(k1), "keys": f"none,{k1}"})).json()
        assert [s["key"] for s in body["series"]] == ["none", str(k1)]
        assert sum(p["calls"] for p in body["series"][0]["points"]) == 0  # the filter left no key-less usage
        assert sum(p["calls"] for p in body["series"][1]["points"]) == 3
        r = await trend({"group_by": "api_key", "api_key_id": str(k1), "keys": f"none,{k1}"}, accept="text/csv")
        assert [row["key"] for row in parse_csv(r.text)] == ["none"] * 8 + [str(k1)] * 8
        foreign = (await trend({"api_key_id": str(k3)})).json()
        assert foreign["as_of"] is None and sum(p["calls"] for p in foreign["series"][0]["points"]) == 0

        # ---- bad input: the contract's 422, in JSON even when CSV was asked for ---------------------
        for path, bad in (
            ("/api/ai/usage/overview", {"api_key_id": "not-a-uuid"}),
            ("/api/ai/usage/trend", {"api_key_id": "123"}),
            ("/api/ai/usage/trend", {"group_by": "key"}),
            ("/api/ai/usage/by-provider", {"group_by": "model"}),
            ("/api/ai/usage/by-provider", {"api_key_id": ""}),
        ):
            for accept in ("application/json", "text/csv"):
                r = await client.get(path, params=dict(window, **bad), headers=dict(headers, Accept=accept))
                assert r.status_code == 422, (path, bad, r.text)
                error = r.json()["error"]
                assert error["code"] == "validation_error" and error["message"] and error["request_id"], error
        assert (await client.get("/api/ai/usage/by-provider", params=window, headers={"Accept": "text/csv"})).status_code == 401


async def test_the_activity_log_exports_every_matching_call_as_csv(settings, monkeypatch):
    monkeypatch.setattr(metering_store, "STREAM_BLOCK_ROWS", 7)  # many blocks of the engine's stream
    async with running_app(settings, targets=("metering",)) as (app, client):
        broker = app.state.runtime.broker
        (account, headers), (other, _) = [await sign_in(app), await sign_in(app)]
        k1, k2 = uuid.uuid4(), uuid.uuid4()
        t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
        calls = [
            CallEvent(
                time=t0 + timedelta(seconds=n // 2),  # pairs share a time: the order still holds (time, id)
                account_id=account,
                api_key_id=k1 if n % 3 else k2,
                method="GET",
                path="/api/geo/projects",
                status=200 if n % 4 else 429,
                ip="10.0.0.1",
                user_agent='agent, with "quotes"',  # CSV quoting
                latency_ms=n / 4,
            )
            for n in range(60)
        ]
        strangers = [c.model_copy(update={"id": uuid.uuid4(), "account_id": other}) for c in calls[:5]]
        await publish_all(
            broker, settings.topic(CALLS.name), [*calls, *strangers, *calls[:9]], lambda e: str(e.account_id).encode()
        )

        async def json_items(params):
            items, cursor = [], None
            while True:
                r = await client.get(
                    "/api/activity-log", params=dict(params, limit=200, **({"cursor": cursor} if cursor else {})), headers=headers
                )
                assert r.status_code == 200, r.text
                items += r.json()["items"]
                if not (cursor := r.json()["next_cursor"]):
                    return items

        async def all_there():
            return len(await json_items({})) == len(calls)

        await wait_until(all_there, timeout=60)
        columns = ["time", "api_key_id", "masked_key", "method", "path", "status", "ip", "user_agent", "latency_ms"]
        columns += ["error_code", "count", "service", "kind", "model_not_allowed", "provider", "model", "resource", "quantity"]
        for params in (
            {},
            {"api_key_id": str(k2)},
            {"start": (t0 + timedelta(seconds=10)).isoformat(), "limit": 3},
            {"outcome": "admitted", "status": 200},  # the JSON page's filters hold in the CSV too
        ):
            r = await client.get("/api/activity-log", params=params, headers=dict(headers, Accept="text/csv"))
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv"), r.text
            assert r.text.splitlines()[0] == ",".join(columns)
            rows = parse_csv(r.text)
            want = await json_items({k: v for k, v in params.items() if k != "limit"})  # the CSV has no page limit
            assert len(rows) == len(want) > 3
            for row, item in zip(rows, want, strict=True):  # the same calls, in the same order (newest first)
                assert datetime.fromisoformat(row["time"]) == datetime.fromisoformat(item["time"])
                assert [row[c] for c in columns[1:]] == [as_csv(item[c]) for c in columns[1:]]
        bad = await client.get("/api/activity-log", params={"api_key_id": "nope"}, headers=dict(headers, Accept="text/csv"))
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "validation_error"
