"""(v4) The by-key view on real Kafka and ClickHouse: each key's own limits (from keys.v1) with the
usage counted in the window of each (usage events naming the key; admitted calls for api_calls),
equal to an independent computation; the CSV equals the JSON; another account's key and usage
never appear."""

import csv
import io
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from contracts.common import Resource
from contracts.events import CallEvent
from contracts.key_limits import KeyLimit, LimitPeriod
from contracts.topics import CALLS, KEYS, USAGE
from tests.support.apps import running_app
from tests.support.metering import ai_tokens, key_state, publish_all, sign_in, wait_until

pytestmark = pytest.mark.integration


def call(
    t: datetime,
    account: uuid.UUID,
    key: uuid.UUID,
    path: str = "/api/geo/projects",
    error: str | None = None,
    service: str | None = None,
) -> CallEvent:
    status = 403 if error else 200
    return CallEvent(
        time=t,
        account_id=account,
        api_key_id=key,
        method="GET",
        path=path,
        status=status,
        ip="10.0.0.1",
        latency_ms=1,
        error_code=error,
        service=service,
    )


def window_starts(now: datetime) -> dict[str, datetime]:
    """The windows' starts in UTC (the tests' platform zone), computed apart from the code."""
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return {
        "day": day,
        "week": day - timedelta(days=day.weekday()),
        "month": day.replace(day=1),
        "once": datetime(1970, 1, 1, tzinfo=UTC),
    }


async def test_the_by_key_view_counts_each_limit_in_its_window_and_shows_no_other_account(settings):
    async with running_app(settings, targets=("metering",)) as (app, client):
        broker = app.state.runtime.broker
        (account, headers), (other, other_headers) = [await sign_in(app), await sign_in(app)]
        k1, k2, k3 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()  # k3 is the other account's
        limits = [
            KeyLimit(resource=Resource.AI_TOKENS, amount=50_000, period=p)
            for p in (LimitPeriod.DAY, LimitPeriod.WEEK, LimitPeriod.MONTH, LimitPeriod.ONCE)
        ] + [KeyLimit(resource=Resource.API_CALLS, amount=10, period=LimitPeriod.DAY)]
        states = [
            key_state(account, k1, "sk-k1k1...k1k1", limits=limits),
            key_state(account, k2, "sk-k2k2...k2k2", limits=[]),
            key_state(other, k3, "sk-k3k3...k3k3", limits=limits),
        ]
        await publish_all(broker, settings.topic(KEYS.name), states, lambda s: str(s.key_id).encode())

        now = datetime.now(UTC)
        usage = [
            ai_tokens(now - timedelta(minutes=1), account, k1, 1000),
            ai_tokens(now - timedelta(hours=30), account, k1, 200),
            ai_tokens(now - timedelta(days=9), account, k1, 30),
            ai_tokens(now - timedelta(days=33), account, k1, 4),
            ai_tokens(now - timedelta(minutes=2), account, k2, 7777),  # another key of the account
            ai_tokens(now - timedelta(minutes=2), account, None, 8888),  # no key
            ai_tokens(now - timedelta(minutes=2), other, k3, 99_999),  # another account's key
            ai_tokens(now - timedelta(minutes=2), other, k1, 55_555),  # another account naming k1: not k1's usage here
        ]
        calls = [
            call(now - timedelta(minutes=1), account, k1),
            call(now - timedelta(minutes=1), account, k1),
            call(now - timedelta(minutes=1), account, k1, error="insufficient_quota"),  # refused: not counted
            call(now - timedelta(minutes=1), account, k1, path="/api/billing/check-quota"),  # a free quota read
            # a platform service's call (verify) on a path named like it: that service's, so counted
            call(now - timedelta(minutes=1), account, k1, path="/api/billing/check-quota", service="ai-gateway"),
            call(now - timedelta(minutes=1), other, k3),
        ]
        await publish_all(broker, settings.topic(USAGE.name), usage, lambda e: str(e.account_id).encode())
        await publish_all(broker, settings.topic(CALLS.name), calls, lambda e: str(e.account_id).encode())

        starts = window_starts(now)
        mine = [e for e in usage if e.account_id == account and e.api_key_id == k1]
        expected = {("ai_tokens", p): sum(e.quantity for e in mine if e.time >= start) for p, start in starts.items()}
        expected[("api_calls", "day")] = 3

        async def view(params: dict[str, str] | None = None, h: dict[str, str] = headers) -> dict:
            r = await client.get("/api/ai/usage/by-key", params=params or {}, headers=h)
            assert r.status_code == 200, r.text
            return r.json()

        async def counted() -> dict | None:
            body = await view()
            items = {i["api_key_id"]: i for i in body["items"]}
            if str(k1) not in items:
                return None
            got = {(lim["resource"], lim["period"]): lim["used"] for lim in items[str(k1)]["limits"]}
            return body if got == expected else None

        body = await wait_until(counted, timeout=60)
        assert [i["api_key_id"] for i in body["items"]] == [str(k1), str(k2)]  # by mask; never k3
        k1_item, k2_item = body["items"]
        assert k1_item["masked_key"] == "sk-k1k1...k1k1" and k2_item == {
            "api_key_id": str(k2),
            "masked_key": "sk-k2k2...k2k2",
            "limits": [],
        }
        by_period = {(lim["resource"], lim["period"]): lim for lim in k1_item["limits"]}
        day = by_period[("ai_tokens", "day")]
        assert day["window"] == starts["day"].date().isoformat() and day["amount"] == 50_000
        assert day["remaining"] == 50_000 - day["used"]
        assert datetime.fromisoformat(day["resets_at"]) == starts["day"] + timedelta(days=1)
        assert by_period[("ai_tokens", "once")]["window"] == "once" and by_period[("ai_tokens", "once")]["resets_at"] is None
        assert by_period[("ai_tokens", "month")]["window"] == now.strftime("%Y-%m")

        # One key by id; another account's key by id gives nothing; the other account sees its own only.
        assert [i["api_key_id"] for i in (await view({"api_key_id": str(k1)}))["items"]] == [str(k1)]
        assert (await view({"api_key_id": str(k3)}))["items"] == []
        theirs = await view(h=other_headers)
        assert [i["api_key_id"] for i in theirs["items"]] == [str(k3)]
        assert {(lim["resource"], lim["period"], lim["used"]) for lim in theirs["items"][0]["limits"]} >= {
            ("ai_tokens", "day", 99_999),
            ("api_calls", "day", 1),
        }

        # The CSV: the same rows, one per key and limit, with the formula guard on text cells.
        r = await client.get("/api/ai/usage/by-key", headers={**headers, "Accept": "text/csv"})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(r.text)))
        assert list(rows[0]) == [
            "api_key_id",
            "masked_key",
            "resource",
            "period",
            "window",
            "used",
            "amount",
            "remaining",
            "resets_at",
        ]
        json_rows = [
            [
                str(k1),
                "sk-k1k1...k1k1",
                lim["resource"],
                lim["period"],
                lim["window"],
                str(lim["used"]),
                str(lim["amount"]),
                str(lim["remaining"]),
                lim["resets_at"] or "",
            ]
            for lim in k1_item["limits"]
        ] + [[str(k2), "sk-k2k2...k2k2", "", "", "", "", "", "", ""]]
        assert [list(row.values()) for row in rows] == json_rows
        assert str(k3) not in r.text and "99999" not in r.text
