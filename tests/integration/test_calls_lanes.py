"""No admitted call goes unmetered, and refused calls are logged (issue 15 items 6 and 9), on the
whole platform in one process (real Kafka, Postgres and the ClickHouse engine): one account floods
the edge with 401s (its disabled key) and 429s (a free-plan key past its rate limit) from many
concurrent tasks while another makes exactly 200 successful API-key calls."""

import asyncio
import hashlib
import secrets
import uuid
from collections import Counter
from datetime import UTC, datetime

import httpx
import pytest

from contracts.common import KeyStatus, Role, Tier
from contracts.events import KeyState, PlanChanged
from contracts.plans import catalogue
from contracts.rate_limit import RateLimit
from contracts.topics import BILLING, KEYS
from tests.integration.quota_helpers import api_calls_used, bearer, eventually, new_account, publish
from tests.support.apps import running_app

pytestmark = pytest.mark.integration
ROOMY = RateLimit(per_second=10_000, burst=10_000, per_minute=1_000_000)
TIGHT = RateLimit(per_second=0.001, burst=3, per_minute=50)  # the flooder's key is soon past its limit
FLOODERS = 8
CALLS = 200


async def new_key(app, settings, account_id: uuid.UUID, status: KeyStatus = KeyStatus.ENABLED) -> tuple[str, uuid.UUID]:
    secret = "sk-" + secrets.token_urlsafe(40)
    state = KeyState(
        time=datetime.now(UTC),
        account_id=account_id,
        key_id=uuid.uuid4(),
        hash=hashlib.sha256(secret.encode()).hexdigest(),
        status=status,
        roles=[Role.OWNER],
    )
    await publish(settings, KEYS.name, [state], key=lambda e: str(e.key_id))
    edge = app.state.runtime.edge

    async def known() -> bool:
        return edge.keys.get(state.hash) is not None

    await eventually(known)
    return secret, state.key_id


async def activity(client: httpx.AsyncClient, headers: dict[str, str], **params: str) -> list[dict]:
    items: list[dict] = []
    cursor = None
    while True:
        r = await client.get(
            "/api/activity-log", params={**params, "limit": "200", **({"cursor": cursor} if cursor else {})}, headers=headers
        )
        assert r.status_code == 200, r.text
        items += r.json()["items"]
        cursor = r.json()["next_cursor"]
        if cursor is None:
            return items


async def test_a_flood_of_refused_calls_neither_crowds_out_nor_miscounts_another_accounts_200_calls(settings):
    async with running_app(settings) as (app, client):
        edge = app.state.runtime.edge
        # Tiny lanes: the flood is folded past 3 refused calls a second (every refusal must still
        # be counted), and the admitted lane fills, so some good calls are refused with 503
        # overloaded (retried: not counted).
        edge.calls.lanes.refused_per_second = 3
        edge.calls.lanes.admitted_capacity = 8
        flooder, flooder_session = await new_account(app, settings)
        disabled, disabled_id = await new_key(app, settings, flooder, KeyStatus.DISABLED)
        limited, limited_id = await new_key(app, settings, flooder)  # free plan: a few calls, then 429
        caller, caller_session = await new_account(app, settings)
        plans = [
            PlanChanged(time=datetime.now(UTC), account_id=a, plan=tier, quotas=catalogue()[tier].quotas, rate_limit=rate)
            for a, tier, rate in ((caller, Tier.ENTERPRISE, ROOMY), (flooder, Tier.FREE, TIGHT))
        ]
        await publish(settings, BILLING.name, plans, key=lambda e: str(e.account_id))

        async def plans_known() -> bool:
            return edge.plans.rate_limit(caller) == ROOMY and edge.plans.rate_limit(flooder) == TIGHT

        await eventually(plans_known)
        good, good_id = await new_key(app, settings, caller)

        done = asyncio.Event()
        seen: Counter[tuple[str, int]] = Counter()

        async def flood(n: int) -> None:
            secret, name = (disabled, "disabled") if n % 2 else (limited, "limited")
            while not done.is_set():
                r = await client.get("/api/geo/projects", headers=bearer(secret))
                seen[(name, r.status_code)] += 1
                # A refusal with nothing else being served is answered at once: pause so the process's
                # own work (Postgres, Kafka) still gets the loop, as a real server's network reads would.
                await asyncio.sleep(0.002)

        overloaded: list[httpx.Response] = []

        async def call_200() -> list[int | str]:
            statuses: list[int | str] = []
            while len(statuses) < CALLS // 10:
                r = await client.get("/api/geo/projects", headers=bearer(good))
                if r.status_code == 503 and r.json()["error"]["code"] == "overloaded":
                    overloaded.append(r)
                    await asyncio.sleep(0.01)  # a client honouring Retry-After, shortened
                    continue
                statuses.append(r.status_code if r.status_code == 200 else r.text)
            return statuses

        flooding = [asyncio.create_task(flood(n)) for n in range(FLOODERS)]
        try:
            await asyncio.sleep(0.2)  # the flood is on before the first good call
            results = await asyncio.gather(*(call_200() for _ in range(10)))

            async def enough_refused() -> bool:  # refusals yield while good calls are served: fewer came meanwhile
                return seen[("disabled", 401)] > 100 and seen[("limited", 429)] > 100

            await eventually(enough_refused)
        finally:
            done.set()
            await asyncio.gather(*flooding)
        assert [s for statuses in results for s in statuses] == [200] * CALLS
        # 10 callers, 8 places each held >= the producer's 20 ms linger: the lane did fill
        assert overloaded, "the tiny admitted lane never filled"
        assert all(r.headers["Retry-After"] == "1" and r.json()["error"]["request_id"] for r in overloaded)
        assert set(seen) <= {("disabled", 401), ("limited", 200), ("limited", 429)}, seen
        assert seen[("disabled", 401)] > 100 and seen[("limited", 429)] > 100, seen

        # The second account: exactly its 200 calls counted and logged (console session: not a call).
        caller_console = bearer(caller_session)

        async def all_counted() -> bool:
            return await api_calls_used(client, caller_console) >= CALLS

        await eventually(all_counted, within=60)

        async def all_logged() -> list[dict] | None:
            items = await activity(client, caller_console, outcome="admitted")
            return items if len(items) >= CALLS else None

        logged = await eventually(all_logged, within=60)
        assert len(logged) == CALLS and {i["api_key_id"] for i in logged} == {str(good_id)}
        assert {(i["status"], i["error_code"], i["count"]) for i in logged} == {(200, None, 1)}
        assert await activity(client, caller_console, outcome="refused") == []
        assert await api_calls_used(client, caller_console) == CALLS, f"{len(overloaded)} calls were refused as overloaded"

        # The first account: every refusal is in its log with its code, folded or not.
        flooder_console = bearer(flooder_session)
        expected = {"api_key_disabled": seen[("disabled", 401)], "rate_limited": seen[("limited", 429)]}

        async def refusals_logged() -> dict[str, int] | None:
            sums: Counter[str] = Counter()
            for item in await activity(client, flooder_console, outcome="refused"):
                sums[item["error_code"]] += item["count"]
            return dict(sums) if dict(sums) == expected else None

        assert await eventually(refusals_logged, within=90) == expected
        refused = await activity(client, flooder_console, outcome="refused")
        assert any(i["count"] > 1 for i in refused)  # folded under the flood
        # Each second: 3 one by one, then a fold per key and code (two: a call that started in the
        # second before folds into one of that second), not an event per refused call.
        seconds = {i["time"][:19] for i in refused}
        assert len(refused) <= (3 + 2 * 2) * (len(seconds) + 1) < sum(expected.values()) / 4, (len(refused), seconds)
        assert {(i["api_key_id"], i["status"], i["error_code"]) for i in refused} == {
            (str(disabled_id), 401, "api_key_disabled"),
            (str(limited_id), 429, "rate_limited"),
        }
        only_401 = await activity(client, flooder_console, status="401")
        assert sum(i["count"] for i in only_401) == expected["api_key_disabled"]
        admitted = await activity(client, flooder_console, outcome="admitted")
        assert len(admitted) == seen[("limited", 200)] and all(i["error_code"] is None for i in admitted)
        # The flooder's admitted calls are its only api_calls.
        assert await api_calls_used(client, flooder_console) == seen[("limited", 200)]

        # Bad filters are the contract's 422; an API key sees only its own account's log.
        for bad in ({"outcome": "denied"}, {"status": "abc"}, {"status": "99"}):
            r = await client.get("/api/activity-log", params=bad, headers=flooder_console)
            assert r.status_code == 422 and r.json()["error"]["code"] == "validation_error", bad
        with_key = await client.get("/api/activity-log", params={"outcome": "refused"}, headers=bearer(good))
        assert with_key.status_code == 200 and with_key.json()["items"] == []
