"""(v4) A key's usage against its own limits on the keys page, in a real browser against a real
`tollgate serve`: a key whose limits are set (its keys.v1 state published here with limits, as the
keys service publishes it after a PATCH) and whose usage events quota counted shows one bar per
limit in the quota page's bands; a red one says when it resets, a `once` one that it never
refills. No `null`, `undefined` or `NaN` reaches the page. Screenshots go to artifacts/screenshots/."""

import re
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, expect

from contracts.common import KeyStatus, Role
from contracts.credentials import hash_secret
from contracts.events import KeyState
from contracts.key_limits import KeyLimit, LimitPeriod
from contracts.topics import KEYS
from services.runtime.platform.settings import Settings
from tests.e2e.console import (
    LAPTOP,
    PHONE,
    WAIT_MS,
    bearer,
    create_key,
    open_console,
    poll,
    register,
    run_beside,
    service_token,
    shot,
    sign_in,
)
from tests.integration.quota_helpers import publish
from tests.support.apps import ServeProcess

# 950 ai_tokens used: 95% of the month (red), 79% of the week (yellow), 48% of the day (green);
# 10 of 10 one-time content publishes (red, never refills).
LIMITS = [
    KeyLimit(resource="ai_tokens", amount=1_000, period=LimitPeriod.MONTH),
    KeyLimit(resource="ai_tokens", amount=1_200, period=LimitPeriod.WEEK),
    KeyLimit(resource="ai_tokens", amount=2_000, period=LimitPeriod.DAY),
    KeyLimit(resource="content_publishes", amount=10, period=LimitPeriod.ONCE),
]
BANDS = {
    ("ai_tokens", "month"): "red",
    ("ai_tokens", "week"): "yellow",
    ("ai_tokens", "day"): "green",
    ("content_publishes", "once"): "red",
}


def usage(account_id: str, key_id: str, resource: str, quantity: int) -> dict[str, Any]:
    event = {"id": str(uuid.uuid4()), "time": datetime.now(UTC).isoformat(), "account_id": account_id, "api_key_id": key_id}
    return {**event, "resource": resource, "quantity": quantity, "provider": "openai", "model": "gpt-4o", "source": "gateway"}


@pytest.mark.integration
def test_a_keys_usage_against_its_limits_shows_as_banded_bars(
    server: ServeProcess, api: httpx.Client, browser: Browser, settings: Settings
) -> None:
    base = server.base_url
    lin = register(api, "lin", "Lin")
    account, console = lin.account, lin.console
    key = create_key(api, console, "ci job")
    plain = create_key(api, console, "no limits")

    # The key's state as keys.v1 carries it once its limits are set: one version after its creation.
    state = KeyState(
        time=datetime.now(UTC),
        account_id=uuid.UUID(account["id"]),
        key_id=uuid.UUID(key["id"]),
        hash=hash_secret(key["key"]),
        status=KeyStatus.ENABLED,
        roles=[Role(r) for r in account["roles"]],
        masked_key=key["masked_key"],
        created_at=datetime.fromisoformat(key["created_at"]),
        created_by=uuid.UUID(account["id"]),
        limits=LIMITS,
        version=2,
    )
    run_beside(publish(settings, KEYS.name, [state], key=lambda e: str(e.key_id)))

    def listed() -> dict[str, Any]:
        items = api.get("/api/api-keys", headers=console).json()["items"]
        return next(item for item in items if item["id"] == key["id"])

    service = bearer(service_token(api, settings, "gateway"))
    # A limit counts from the moment quota knows it: wait until quota refuses a reservation past it.
    past = {"account_id": account["id"], "resource": "ai_tokens", "amount": 1_001, "ttl_seconds": 60, "api_key_id": key["id"]}

    def quota_knows_the_limits() -> bool:
        answer = api.post("/api/quota/reservations", json=past, headers=service)
        if answer.status_code == 201:  # judged before quota knew the limit: hold nothing
            assert api.delete(f"/api/quota/reservations/{answer.json()['id']}", headers=service).status_code == 204
            return False
        return answer.status_code == 403 and answer.json()["error"]["details"]["scope"] == "api_key"

    poll(quota_knows_the_limits, "quota learning the key's limits from keys.v1", timeout=30)
    events = [usage(account["id"], key["id"], "ai_tokens", 950), usage(account["id"], key["id"], "content_publishes", 10)]
    reported = api.post("/api/usage/events", json={"events": events}, headers=service)
    assert reported.status_code == 202, reported.text

    def counted() -> bool:
        used = {(u["resource"], u["period"]): u["used"] for u in listed()["usage"]}
        return used == {(resource, period): 10 if resource == "content_publishes" else 950 for resource, period in BANDS}

    poll(counted, "the usage counted against the key's limits")

    for viewport in (LAPTOP, PHONE):
        page, page_errors = open_console(browser, base, viewport)
        sign_in(page, base, lin.email)
        row = page.locator(f'#keys-table tr[data-key-id="{key["id"]}"]')
        expect(row).to_contain_text("ci job", timeout=WAIT_MS)
        limits = row.locator(".key-limit-usage")
        expect(limits).to_have_count(len(LIMITS))
        for (resource, period), band in BANDS.items():
            limit = row.locator(f'.key-limit-usage[data-resource="{resource}"][data-period="{period}"]')
            bar = limit.get_by_role("progressbar")
            expect(bar).to_be_visible()
            expect(bar).to_have_attribute("data-band", band)
            expect(bar.locator(f".bar-fill.band-{band}")).to_be_visible()
            resets = limit.locator(".key-limit-resets")
            expect(resets).to_have_count(1 if band == "red" else 0)
        month = row.locator('.key-limit-usage[data-period="month"]')
        expect(month).to_contain_text("950 of 1,000 used, 50 left")
        expect(month.get_by_role("progressbar")).to_have_attribute("aria-valuenow", "95")
        expect(month.locator(".key-limit-resets")).to_have_text(re.compile(r"^Resets .+\d"))
        trial = row.locator('.key-limit-usage[data-period="once"]')
        expect(trial.locator(".key-limit-resets")).to_have_text("Never refills: one-time credits.")
        # a key without limits shows no bars
        plain_row = page.locator(f'#keys-table tr[data-key-id="{plain["id"]}"]')
        expect(plain_row.locator(".key-usage")).to_be_hidden()
        text = page.locator("#keys-table").inner_text()
        assert not re.search(r"\b(null|undefined|NaN)\b", text), text
        row.scroll_into_view_if_needed()
        shot(page, "keys-usage")
        assert page_errors == []
        page.context.close()
