"""`tollgate up`'s demo data (services/runtime/host/demo_data.py) against the whole platform on
real Kafka, Postgres, ClickHouse and redis: seven days of usage across 3 providers and 6 models, an
alert that fired, a paid order with its invoice, admitted and refused calls; and a second run
changes no number."""

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from services.runtime.host import demo_data
from tests.support.apps import running_app
from tests.support.metering import wait_until
from tests.support.service_tokens import operator_service_headers

pytestmark = pytest.mark.integration

EMAIL = "demo@tollgate.local"
PASSWORD = "demo-password-123"


async def _numbers(client: httpx.AsyncClient, console: dict[str, str], planned: list[dict[str, Any]]) -> dict[str, Any]:
    """What the usage page shows over the seven days: the overview and the per-provider table."""
    params = _span(planned)
    overview = await client.get("/api/ai/usage/overview", params=params, headers=console)
    providers = await client.get("/api/ai/usage/by-provider", params=params, headers=console)
    assert overview.status_code == 200 and providers.status_code == 200, (overview.text, providers.text)
    body = overview.json()
    return {
        "span": {k: body[k] for k in ("total_tokens", "input_tokens", "output_tokens", "calls", "estimated_cost")},
        "by_provider": sorted((r["provider"], r["model"], r["calls"], r["total_tokens"]) for r in providers.json()["items"]),
    }


async def test_the_demo_account_gets_a_week_of_usage_an_alert_and_an_invoice_and_a_rerun_changes_nothing(settings) -> None:
    async with running_app(settings) as (app, client):
        registered = await client.post(
            "/api/auth/register", json={"email": EMAIL, "password": PASSWORD, "name": "Demo", "user_type": "individual"}
        )
        assert registered.status_code == 201, registered.text
        token = (await operator_service_headers(app, "demo platform service"))["Authorization"].removeprefix("Bearer ")
        now = datetime.now(UTC)  # both runs end the week at the same instant

        first = await demo_data.seed(client, email=EMAIL, password=PASSWORD, service_token=token, now=now)
        assert first.paid_order and first.alert_rule
        assert first.usage_events == first.new_usage_events > 0
        assert first.calls > 0 and first.refused_calls > 0

        login = await client.post("/api/auth/login", json={"email": EMAIL, "password": PASSWORD})
        console = {"Authorization": f"Bearer {login.json()['access_token']}"}
        planned = demo_data.planned_usage(uuid.UUID(registered.json()["id"]), now)
        tokens = sum(e["quantity"] for e in planned)

        # every planned event counted once (over the seven days' span: "This week" starts on Monday)
        async def all_counted() -> bool:
            return await _span_tokens(client, console, planned) == tokens

        await wait_until(all_counted, timeout=60)
        before = await _numbers(client, console, planned)
        assert before["span"]["total_tokens"] == tokens and before["span"]["calls"] == len(planned)
        assert {p for p, *_ in before["by_provider"]} == {"openai", "anthropic", "google"}
        assert len({(p, m) for p, m, *_ in before["by_provider"]}) == 6
        assert (await client.get("/api/ai/usage/overview", params={"range": "today"}, headers=console)).json()["total_tokens"] > 0

        # the alert fired (in-site), the upgrade is paid and has its invoice
        async def notified() -> list[dict[str, Any]]:
            response = await client.get("/api/notifications", headers=console)
            return [n for n in response.json()["items"] if n.get("metric") == "total_tokens"]

        assert await wait_until(notified, timeout=60)
        orders = (await client.get("/api/billing/orders", headers=console)).json()["items"]
        paid = [o for o in orders if o["status"] == "paid"]
        assert len(paid) == 1
        invoice = await client.get(f"/api/billing/orders/{paid[0]['id']}/invoice", headers=console)
        assert invoice.status_code == 200 and invoice.json()["number"].startswith("TG-"), invoice.text
        assert (await client.get("/api/billing/subscription", headers=console)).json()["plan"] == "basic"

        # refused calls are in the activity log
        async def refused() -> list[dict[str, Any]]:
            response = await client.get("/api/activity-log", params={"outcome": "refused"}, headers=console)
            return list(response.json()["items"])

        async def both_refusals() -> set[str]:
            codes = {item["error_code"] for item in await refused()}
            return codes if {"api_key_disabled", "console_session_required"} <= codes else set()

        await wait_until(both_refusals, timeout=60)

        # a second run: nothing new, no second order, rule, key or call; the same numbers
        second = await demo_data.seed(client, email=EMAIL, password=PASSWORD, service_token=token, now=now)
        assert second.as_dict() == {**demo_data.Report(usage_events=first.usage_events).as_dict()}
        rules = (await client.get("/api/ai/usage/alert", headers=console)).json()["rules"]
        assert len(rules) == 1
        keys = (await client.get("/api/api-keys", headers=console)).json()["items"]
        assert sorted(k["name"] for k in keys) == sorted([demo_data.APP_KEY_NAME, demo_data.RETIRED_KEY_NAME])
        assert (
            len([o for o in (await client.get("/api/billing/orders", headers=console)).json()["items"] if o["status"] == "paid"])
            == 1
        )
        assert await _numbers(client, console, planned) == before


async def _span_tokens(client: httpx.AsyncClient, console: dict[str, str], planned: list[dict[str, Any]]) -> int:
    """The tokens counted over the seven days' span."""
    response = await client.get("/api/ai/usage/overview", params=_span(planned), headers=console)
    assert response.status_code == 200, response.text
    return int(response.json()["total_tokens"])


def _span(planned: list[dict[str, Any]]) -> dict[str, str]:
    """A custom range covering every planned event (the calendar week may be shorter)."""
    times = sorted(datetime.fromisoformat(e["time"]) for e in planned)
    return {"range": "custom", "start": times[0].isoformat(), "end": (times[-1] + timedelta(seconds=1)).isoformat(), "tz": "UTC"}
