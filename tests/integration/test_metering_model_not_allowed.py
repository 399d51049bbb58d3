"""(v4) Usage of a model its key does not allow, on real Kafka and ClickHouse: it is counted (it was
served), stored flagged by the sink (judged against the key's allowed_models from keys.v1 when it is
written), and listed in the activity log (JSON, its keyset pages and CSV) as an item of kind usage
among the calls; allowed usage is not listed; another account never sees it; a later change of the
key's rules leaves past usage as it was judged."""

import csv
import io
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from contracts.events import CallEvent
from contracts.topics import CALLS, KEYS, USAGE
from tests.support.apps import running_app
from tests.support.metering import ai_tokens, key_state, metering_sink, publish_all, sign_in, wait_until

pytestmark = pytest.mark.integration


def call(t: datetime, account: uuid.UUID, key: uuid.UUID) -> CallEvent:
    return CallEvent(
        time=t, account_id=account, api_key_id=key, method="POST", path="/v1/chat", status=200, ip="10.0.0.1", latency_ms=3
    )


async def test_usage_of_a_model_its_key_does_not_allow_is_counted_and_flagged_in_the_activity_log(settings):
    async with running_app(settings, targets=("metering",)) as (app, client):
        broker = app.state.runtime.broker
        (account, headers), (other, other_headers) = [await sign_in(app), await sign_in(app)]
        narrow, wide, foreign = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
        states = [
            key_state(account, narrow, "sk-narr...rrow", allowed_models=["openai/*"]),
            key_state(account, wide, "sk-wide...wide", allowed_models=[]),
            key_state(other, foreign, "sk-frgn...frgn", allowed_models=["openai/*"]),
        ]
        await publish_all(broker, settings.topic(KEYS.name), states, lambda s: str(s.key_id).encode())

        async def live_keys(h: dict[str, str]) -> set[str]:
            r = await client.get("/api/ai/usage/by-key", headers=h)
            return {item["api_key_id"] for item in r.json()["items"]}

        # metering's projection of keys.v1 holds the rules before the usage is written
        await wait_until(lambda: _eq(live_keys(headers), {str(narrow), str(wide)}))
        await wait_until(lambda: _eq(live_keys(other_headers), {str(foreign)}))

        now = datetime.now(UTC)
        denied = ai_tokens(now - timedelta(seconds=30), account, narrow, 120, "anthropic", "claude-x")
        allowed = ai_tokens(now - timedelta(seconds=20), account, narrow, 30, "openai", "gpt-4o")
        unruled = ai_tokens(now - timedelta(seconds=10), account, wide, 7, "anthropic", "claude-x")
        theirs = ai_tokens(now - timedelta(seconds=25), other, foreign, 5000, "anthropic", "claude-x")
        calls = [call(now - timedelta(seconds=s), account, narrow) for s in (35, 22, 5)]
        events: list[Any] = [denied, allowed, unruled, theirs]
        await publish_all(broker, settings.topic(USAGE.name), events, lambda e: str(e.account_id).encode())
        await publish_all(broker, settings.topic(CALLS.name), calls, lambda e: str(e.account_id).encode())

        window = {
            "range": "custom",
            "start": (now - timedelta(hours=1)).isoformat(),
            "end": (now + timedelta(hours=1)).isoformat(),
        }

        async def total_tokens() -> int:
            r = await client.get("/api/ai/usage/overview", params=window, headers=headers)
            return int(r.json()["total_tokens"])

        await wait_until(lambda: _eq(total_tokens(), 120 + 30 + 7))  # the denied usage is counted

        async def log(params: dict[str, str] | None = None, h: dict[str, str] = headers) -> list[dict[str, Any]]:
            r = await client.get("/api/activity-log", params=params or {}, headers=h)
            assert r.status_code == 200, r.text
            return list(r.json()["items"])

        items = await wait_until(lambda: _with_calls(log(), 3))
        assert [(i["kind"], _ms(i["time"])) for i in items] == sorted(
            [("call", _ms(c.time)) for c in calls] + [("usage", _ms(denied.time))], key=lambda kt: kt[1], reverse=True
        )
        (flagged,) = [i for i in items if i["kind"] == "usage"]
        assert _ms(flagged["time"]) == _ms(denied.time)
        assert {k: v for k, v in flagged.items() if k != "time"} == {
            "api_key_id": str(narrow),
            "masked_key": "sk-narr...rrow",
            "method": "USAGE",
            "path": "anthropic/claude-x",
            "status": 200,
            "ip": "",
            "user_agent": "",
            "latency_ms": 0.0,
            "error_code": None,
            "count": 1,
            "service": None,
            "kind": "usage",
            "model_not_allowed": True,
            "provider": "anthropic",
            "model": "claude-x",
            "resource": "ai_tokens",
            "quantity": 120,
        }
        assert all(not i["model_not_allowed"] and i["provider"] is None for i in items if i["kind"] == "call")

        # the keyset cursor pages across both sources, one item a page, in the same order
        paged, cursor = [], None
        while True:
            r = await client.get(
                "/api/activity-log", params={"limit": "1"} | ({"cursor": cursor} if cursor else {}), headers=headers
            )
            paged += r.json()["items"]
            cursor = r.json()["next_cursor"]
            if cursor is None:
                break
        assert paged == items

        # the filters apply to the usage items too
        assert [i["kind"] for i in await log({"api_key_id": str(narrow)})] == [i["kind"] for i in items]
        assert await log({"api_key_id": str(wide)}) == []
        assert "usage" not in {i["kind"] for i in await log({"ip": "10.0.0.1"})}
        assert await log({"outcome": "refused"}) == []
        assert [i["kind"] for i in await log({"outcome": "admitted", "status": "200"})] == [i["kind"] for i in items]
        start, end = (denied.time - timedelta(seconds=1)).isoformat(), (denied.time + timedelta(seconds=1)).isoformat()
        assert [i["kind"] for i in await log({"start": start, "end": end})] == ["usage"]

        # the CSV streams the same items, the flag in its own columns
        r = await client.get("/api/activity-log", headers=headers | {"Accept": "text/csv"})
        rows = list(csv.DictReader(io.StringIO(r.text)))
        assert [(row["kind"], _ms(row["time"])) for row in rows] == [(i["kind"], _ms(i["time"])) for i in items]
        (usage_row,) = [row for row in rows if row["kind"] == "usage"]
        assert (usage_row["model_not_allowed"], usage_row["path"], usage_row["quantity"]) == ("true", "anthropic/claude-x", "120")
        assert {row["model_not_allowed"] for row in rows if row["kind"] == "call"} == {"false"}

        # another account sees its own flagged usage only, never this one's
        (their,) = await wait_until(lambda: _nonempty(log(h=other_headers)))
        assert (their["kind"], their["api_key_id"], their["quantity"]) == ("usage", str(foreign), 5000)
        assert str(foreign) not in {i["api_key_id"] for i in items}

        # judged when written: widening the key flags no new usage and clears no old flag
        await publish_all(
            broker,
            settings.topic(KEYS.name),
            [key_state(account, narrow, "sk-narr...rrow", allowed_models=["openai/*", "anthropic/*"], version=2)],
            lambda s: str(s.key_id).encode(),
        )
        await wait_until(lambda: _known_models(app, account, narrow, ("openai/*", "anthropic/*")))
        later = ai_tokens(now - timedelta(seconds=2), account, narrow, 40, "anthropic", "claude-x")
        await publish_all(broker, settings.topic(USAGE.name), [later], lambda e: str(e.account_id).encode())
        await wait_until(lambda: _eq(total_tokens(), 120 + 30 + 7 + 40))
        assert [i["quantity"] for i in await log() if i["kind"] == "usage"] == [120]


def _ms(t: datetime | str) -> datetime:
    """A time as ClickHouse keeps it (milliseconds), from an event or from the API's answer."""
    moment = datetime.fromisoformat(t) if isinstance(t, str) else t
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


async def _eq(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def _with_calls(items: Any, n: int) -> list[dict[str, Any]] | None:
    got = await items
    return got if sum(i["kind"] == "call" for i in got) >= n and any(i["kind"] == "usage" for i in got) else None


async def _nonempty(items: Any) -> Any:
    return await items or None


async def _known_models(app: Any, account: uuid.UUID, key: uuid.UUID, models: tuple[str, ...]) -> bool:
    return bool(metering_sink(app).allowed_models(account, key) == models)
