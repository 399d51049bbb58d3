"""(v2) Stock is exact: 50 concurrent GEO creators across two real `serve` processes against a
free account's `geo_projects` total of 3 -> exactly 3 projects, 47 answers 403 insufficient_quota
with the details, and a deleted project frees exactly one place."""

import asyncio
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.integration.test_keys_api import PASSWORD, bearer, code
from tests.support.apps import ServeProcess

pytestmark = pytest.mark.integration
GEO = "/api/geo/projects"


async def _known_within(client: httpx.AsyncClient, headers: dict[str, str], deadline_s: float = 20.0) -> None:
    """Until this process's edge knows the account (accounts.v1)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while (await client.get(GEO, headers=headers)).status_code != 200:
        assert loop.time() - started < deadline_s
        await asyncio.sleep(0.05)


async def test_fifty_concurrent_creators_on_two_processes_make_exactly_the_total(settings):
    a, b = ServeProcess(settings, "keys,geo"), ServeProcess(settings, "keys,geo")
    try:
        a.wait_ready()
        b.wait_ready()
        async with (
            httpx.AsyncClient(base_url=a.base_url, timeout=30) as on_a,
            httpx.AsyncClient(base_url=b.base_url, timeout=30) as on_b,
        ):
            email = "geo-exact@example.com"
            body = {"email": email, "password": PASSWORD, "name": "Geo", "user_type": "individual"}
            assert (await on_a.post("/api/auth/register", json=body)).status_code == 201
            login = await on_a.post("/api/auth/login", json={"email": email, "password": PASSWORD})
            console = bearer(login.json()["access_token"])  # sessions: no rate limit in the way
            await _known_within(on_a, console)
            await _known_within(on_b, console)

            answers = await asyncio.gather(
                *[(on_a if n % 2 else on_b).post(GEO, json={"name": f"p{n}"}, headers=console) for n in range(50)]
            )
            statuses = sorted(r.status_code for r in answers)
            assert statuses == [201] * 3 + [403] * 47, [r.text for r in answers if r.status_code not in (201, 403)]
            refused = [r.json()["error"] for r in answers if r.status_code == 403]
            assert {e["code"] for e in refused} == {"insufficient_quota"}
            now = datetime.now(UTC)
            period_end = (now.replace(day=1) + timedelta(days=32)).replace(day=1).strftime("%Y-%m-01T00:00:00Z")
            base = settings.console_url.rstrip("/")
            expected = {
                "resource": "geo_projects",
                "used": 3,
                "total": 3,
                "period_end": period_end,
                "links": {"upgrade_plan": f"{base}/plan", "buy_quota_package": f"{base}/quota?buy=geo_projects"},
                "scope": "account",  # (v4) the account's quota, not one key's own limit
            }
            assert [e["details"] for e in refused] == [expected] * 47
            created = {r.json()["id"] for r in answers if r.status_code == 201}
            for client in (on_a, on_b):
                listed = (await client.get(GEO, headers=console)).json()["items"]
                assert {p["id"] for p in listed} == created

            # Deleting one frees exactly one place, again under concurrency.
            gone = created.pop()
            assert (await on_b.delete(f"{GEO}/{gone}", headers=console)).status_code == 204
            again = await asyncio.gather(
                *[(on_a if n % 2 else on_b).post(GEO, json={"name": f"q{n}"}, headers=console) for n in range(10)]
            )
            assert sorted(r.status_code for r in again) == [201] + [403] * 9
            assert {code(r) for r in again if r.status_code == 403} == {"insufficient_quota"}
            assert len((await on_a.get(GEO, headers=console)).json()["items"]) == 3
    finally:
        a.stop()
        b.stop()
