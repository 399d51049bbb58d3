"""Activity log (keyset pagination, filters, masked keys from keys.v1, account scoping) and the
analyst queries of docs/clickhouse.md, run against the real ClickHouse engine."""

import asyncio
import hashlib
import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from contracts.common import KeyStatus, Resource, Role
from contracts.events import CallEvent, KeyState, UsageEvent
from contracts.topics import CALLS, KEYS, USAGE
from services.runtime.platform import clickhouse
from tests.support.apps import running_app
from tests.support.metering import publish_all, sign_in, wait_until

pytestmark = pytest.mark.integration
DOC = Path(__file__).resolve().parents[2] / "docs" / "clickhouse.md"
T0 = (datetime.now(UTC) - timedelta(days=2)).replace(minute=0, second=0, microsecond=0)


def key_of(e) -> bytes:
    return str(e.account_id).encode()


async def test_activity_log_pages_filters_and_masks(settings):
    async with running_app(settings, targets=("metering",)) as (app, client):
        broker = app.state.runtime.broker
        (account, headers), (other, other_headers) = [await sign_in(app), await sign_in(app)]
        k1, k2 = uuid.uuid4(), uuid.uuid4()
        await broker.publish(
            KeyState(
                time=T0,
                account_id=account,
                key_id=k1,
                hash=hashlib.sha256(b"x").hexdigest(),
                status=KeyStatus.ENABLED,
                roles=[Role.OWNER],
                masked_key="sk-abcd...wxyz",
            ),
            settings.topic(KEYS.name),
            key=str(k1).encode(),
        )
        calls = [
            CallEvent(
                # Some share a timestamp: the keyset must still neither skip nor repeat.
                time=T0 + timedelta(milliseconds=1000 * (n // 3)),
                account_id=account,
                api_key_id=k1 if n % 2 else k2,
                method="GET",
                path="/api/geo/projects",
                status=200 if n % 5 else 500,
                ip=f"10.0.0.{n % 3}",
                user_agent="test",
                latency_ms=n / 10,
            )
            for n in range(123)
        ]
        strangers = [c.model_copy(update={"id": uuid.uuid4(), "account_id": other}) for c in calls[:7]]
        await publish_all(broker, settings.topic(CALLS.name), [*calls, *strangers, *calls[:10]], key_of)

        async def pages(params):
            items, cursor = [], None
            while True:
                q = dict(params, **({"cursor": cursor} if cursor else {}))
                r = await client.get("/api/activity-log", params=q, headers=headers)
                assert r.status_code == 200, r.text
                body = r.json()
                items += body["items"]
                cursor = body["next_cursor"]
                if cursor is None:
                    return items

        async def all_there():
            return len(await pages({"limit": 200})) == len(calls)

        await wait_until(all_there, timeout=60)
        got = await pages({"limit": 50})
        assert len(got) == 123 and len({(i["time"], i["api_key_id"], i["latency_ms"]) for i in got}) == 123
        times = [datetime.fromisoformat(i["time"]) for i in got]
        assert times == sorted(times, reverse=True)
        assert {i["masked_key"] for i in got if i["api_key_id"] == str(k1)} == {"sk-abcd...wxyz"}
        assert {i["masked_key"] for i in got if i["api_key_id"] == str(k2)} == {None}

        def expected(pred):
            return sorted(round(c.latency_ms, 1) for c in calls if pred(c))

        by_key = await pages({"limit": 7, "api_key_id": str(k1)})
        assert sorted(i["latency_ms"] for i in by_key) == expected(lambda c: c.api_key_id == k1)
        by_ip = await pages({"limit": 20, "ip": "10.0.0.2"})
        assert sorted(i["latency_ms"] for i in by_ip) == expected(lambda c: c.ip == "10.0.0.2")
        lo, hi = T0 + timedelta(seconds=5), T0 + timedelta(seconds=20)
        window = await pages({"start": lo.isoformat(), "end": hi.isoformat()})
        assert sorted(i["latency_ms"] for i in window) == expected(lambda c: lo <= c.time < hi)

        r = await client.get("/api/activity-log", headers=other_headers)
        assert len(r.json()["items"]) == 7
        for bad in ({"cursor": "!!"}, {"limit": 0}, {"limit": 201}, {"api_key_id": "nope"}, {"start": "2026-11-01T00:00:00"}):
            r = await client.get("/api/activity-log", params=bad, headers=headers)
            assert r.status_code == 422 and r.json()["error"]["code"] == "validation_error", bad

        # ---- the analyst queries of docs/clickhouse.md, on the same database ----------------------
        usage = [
            UsageEvent(
                time=T0 + timedelta(hours=n),
                account_id=account,
                resource=Resource.AI_TOKENS,
                quantity=10,
                provider="openai",
                model="gpt-4o",
                input_tokens=4,
                output_tokens=6,
                source="doc",
            )
            for n in range(24)
        ]
        await publish_all(broker, settings.topic(USAGE.name), usage, key_of)

        async def usage_there():
            r = await client.get(
                "/api/ai/usage/overview",
                params={"range": "custom", "start": T0.isoformat(), "end": (T0 + timedelta(days=1)).isoformat()},
                headers=headers,
            )
            return r.json()["calls"] == 24

        await wait_until(usage_there, timeout=60)
        ch = clickhouse.connect(settings.clickhouse_dsn)
        blocks = re.findall(r"```sql\n(.*?)```", DOC.read_text(), flags=re.S)
        assert len(blocks) >= 5
        results = []
        for sql in blocks:
            text = sql.replace("{db}", settings.clickhouse_database)
            results.append(await asyncio.to_thread(lambda t=text: ch.query(t, parameters={"account": account}).result_rows))
        per_day = results[0]
        assert sum(r[3] for r in per_day) == 24 and sum(r[4] for r in per_day) == 240
        assert results[2] and sum(r[3] for r in results[2]) == 123
        assert results[3] == [("/api/geo/projects", 123, pytest.approx(results[3][0][2]))]
        assert results[4] == [(240, 240)]
        assert results[5] == []  # refused calls per key and code: this account's calls were all admitted

        # ---- a copy that slipped past the sink (a rebalance race) is not listed twice ------------
        db = settings.clickhouse_database
        cols = "id, time, account_id, api_key_id, method, path, status, ip, user_agent, latency_ms"
        twins = (
            f"INSERT INTO {db}.call_events ({cols}) SELECT {cols} FROM {db}.call_events "
            f"WHERE account_id = '{account}' ORDER BY time DESC LIMIT 5"
        )
        await asyncio.to_thread(ch.command, f"SYSTEM STOP MERGES {db}.call_events")  # keep the twins unmerged
        await asyncio.to_thread(ch.command, twins)
        raw = await asyncio.to_thread(lambda: ch.query(f"SELECT count() FROM {db}.call_events WHERE account_id = '{account}'"))
        assert raw.result_rows[0][0] == 128  # the twins are there
        again = await pages({"limit": 2})
        assert len(again) == 123 and len({(i["time"], i["api_key_id"], i["latency_ms"]) for i in again}) == 123
        await asyncio.to_thread(ch.command, f"SYSTEM START MERGES {db}.call_events")
