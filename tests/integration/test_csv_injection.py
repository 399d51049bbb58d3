"""CSV injection (issue 37): a caller chooses its User-Agent, and a platform service names the
provider and model of the usage it reports. A text that starts with `=`, `+`, `-`, `@`, a tab or a
carriage return must leave the CSV exports (activity log, trend, by-provider) as text a spreadsheet
shows, not as a live formula: prefixed with `'` (OWASP). Through the real endpoints, from the call
that carries the User-Agent to the CSV that is downloaded."""

import csv
import io
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.integration.test_keys_api import bearer, new_key, signup
from tests.support.metering import wait_until
from tests.support.service_tokens import service_headers

pytestmark = pytest.mark.integration

HYPERLINK = '=HYPERLINK("http://evil.example","x")'
AGENTS = [HYPERLINK, "+1+1", "-2+3", "@SUM(A1:A9)"]  # a header value cannot start with a tab or CR: see providers
PROVIDERS = ["=cmd", "+p", "-p", "@p", "\tp", "\rp"]
HARMLESS = "curl/8.5.0"
QUOTED_CELL = '"\'=HYPERLINK(""http://evil.example"",""x"")"'  # CSV-quoted, prefixed


def rows(response: httpx.Response) -> list[dict[str, str]]:
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv"), response.text
    return list(csv.DictReader(io.StringIO(response.text, newline="")))


def as_text(value: str) -> str:
    return "'" + value


async def test_csv_exports_write_formula_like_text_as_text(client, settings):
    account, console = await signup(client)
    key = bearer((await new_key(client, console))["key"])
    for agent in [*AGENTS, HARMLESS]:
        called = await client.get("/api/geo/projects", headers={**key, "User-Agent": agent})
        assert called.status_code == 200, called.text
    now = datetime.now(UTC)
    events = [
        {
            "id": str(uuid.uuid4()), "time": now.isoformat(), "account_id": account["id"], "resource": "ai_tokens",
            "quantity": 30, "input_tokens": 10, "output_tokens": 20, "provider": provider, "model": "m", "source": "gateway",
        }
        for provider in [*PROVIDERS, "openai"]
    ]  # fmt: skip
    reported = await client.post("/api/usage/events", json={"events": events}, headers=await service_headers(client, settings))
    assert reported.status_code == 202, reported.text
    window = {"range": "custom", "start": (now - timedelta(hours=1)).isoformat(), "end": (now + timedelta(hours=1)).isoformat()}
    as_csv = {**console, "Accept": "text/csv"}

    async def every_call_logged() -> bool:
        page = await client.get("/api/activity-log", params={"limit": 50}, headers=console)
        return len(page.json()["items"]) == len(AGENTS) + 1

    async def every_event_counted() -> bool:
        page = await client.get("/api/ai/usage/by-provider", params=window, headers=console)
        return len(page.json()["items"]) == len(PROVIDERS) + 1

    await wait_until(every_call_logged, timeout=60)
    await wait_until(every_event_counted, timeout=60)

    exported = await client.get("/api/activity-log", headers=as_csv)
    logged = rows(exported)
    assert sorted(r["user_agent"] for r in logged) == sorted([*map(as_text, AGENTS), HARMLESS])
    assert QUOTED_CELL in exported.text  # the raw cell, as a spreadsheet reads it
    assert {r["path"] for r in logged} == {"/api/geo/projects"}  # other text as it is
    assert all(float(r["latency_ms"]) >= 0 and r["count"] == "1" for r in logged)  # numbers as numbers

    by_provider = rows(await client.get("/api/ai/usage/by-provider", params=window, headers=as_csv))
    assert sorted(r["provider"] for r in by_provider) == sorted([*map(as_text, PROVIDERS), "openai"])
    assert {r["total_tokens"] for r in by_provider} == {"30"}

    trend = rows(await client.get("/api/ai/usage/trend", params={**window, "group_by": "model"}, headers=as_csv))
    assert {r["key"] for r in trend} == {*(as_text(f"{p}/m") for p in PROVIDERS), "openai/m"}
    # The JSON keeps the values as they are: only the CSV guards spreadsheets.
    page = await client.get("/api/activity-log", headers=console)
    assert HYPERLINK in {i["user_agent"] for i in page.json()["items"]}
