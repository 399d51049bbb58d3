"""(v4) Key-scoped alert rules and the activity log's flag in a real browser against a real
`tollgate serve`: the alerts page offers "For key" with the account's keys, makes a rule that
watches one key and one that watches the account, and lists each rule's scope (the key by its
name and masked key); the usage page's activity log marks usage of a model its key does not allow
with a badge. Screenshots go to artifacts/screenshots/.

The key narrowed to `openai/*` is stated on keys.v1 directly (as the keys service publishes a key's
rules), so this story does not depend on the keys page's form."""

import asyncio
import hashlib
import secrets
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from playwright.sync_api import Browser, expect

from contracts.common import KeyStatus, Resource, Role
from contracts.events import KeyState, UsageEvent
from contracts.topics import KEYS, USAGE
from tests.e2e.test_console import LAPTOP, WAIT_MS, browser, poll, server, shot  # noqa: F401 (fixtures)
from tests.integration.quota_helpers import publish
from tests.support.apps import ServeProcess

PASSWORD = "correct horse battery"


def _publish(settings, topic: str, events: list, key) -> None:  # type: ignore[no-untyped-def]
    with ThreadPoolExecutor(1) as thread:  # the test's own event loop is running: publish beside it
        thread.submit(asyncio.run, publish(settings, topic, events, key=key)).result()


@pytest.mark.integration
def test_a_rule_for_one_key_is_made_and_listed_with_its_key_and_flagged_usage_shows_a_badge(
    server: ServeProcess,  # noqa: F811
    browser: Browser,  # noqa: F811
    settings,
) -> None:
    base = server.base_url
    api = httpx.Client(base_url=base, timeout=10)
    email = f"keyalerts-{uuid.uuid4().hex[:8]}@example.com"
    registered = api.post(
        "/api/auth/register", json={"email": email, "password": PASSWORD, "name": "Key alerts", "user_type": "individual"}
    )
    assert registered.status_code == 201, registered.text
    account_id = uuid.UUID(registered.json()["id"])
    token = api.post("/api/auth/login", json={"email": email, "password": PASSWORD}).json()["access_token"]
    session = {"Authorization": f"Bearer {token}"}
    created = api.post("/api/api-keys", json={"name": "ci"}, headers=session)
    assert created.status_code == 201, created.text
    ci = created.json()

    # A key that may use openai/* only, and two of its usage events: one allowed, one not.
    narrow_id, secret = uuid.uuid4(), "sk-" + secrets.token_urlsafe(40)
    narrow = KeyState(
        time=datetime.now(UTC),
        account_id=account_id,
        key_id=narrow_id,
        hash=hashlib.sha256(secret.encode()).hexdigest(),
        status=KeyStatus.ENABLED,
        roles=[Role.OWNER],
        masked_key="sk-nrrw...only",
        allowed_models=["openai/*"],
    )
    _publish(settings, KEYS.name, [narrow], key=lambda s: str(s.key_id))

    def usage(model: str, provider: str, seconds_ago: int) -> UsageEvent:
        return UsageEvent(
            time=datetime.now(UTC) - timedelta(seconds=seconds_ago),
            account_id=account_id,
            resource=Resource.AI_TOKENS,
            quantity=120,
            provider=provider,
            model=model,
            source="gateway",
            api_key_id=narrow_id,
        )

    def flagged() -> list:
        items = api.get("/api/activity-log", headers=session).json()["items"]
        return [i for i in items if i["kind"] == "usage"]

    # the sink judges by the key's rules when it writes: the key must have reached metering first
    poll(
        lambda: any(k["api_key_id"] == str(narrow_id) for k in api.get("/api/ai/usage/by-key", headers=session).json()["items"]),
        "metering knows the key",
    )
    _publish(
        settings, USAGE.name, [usage("claude-x", "anthropic", 20), usage("gpt-4o", "openai", 10)], key=lambda e: str(e.account_id)
    )
    poll(flagged, "the flagged usage in the activity log", timeout=30)

    context = browser.new_context(viewport=LAPTOP, base_url=base)
    page = context.new_page()
    page_errors: list[str] = []
    page.on("pageerror", lambda exc: page_errors.append(str(exc)))
    page.goto(f"{base}/console")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("API keys", timeout=WAIT_MS)

    # ---- alerts: one rule for the ci key, one for the account ----------------------------------
    page.goto(f"{base}/console/alerts")
    expect(page.get_by_role("heading", level=1)).to_have_text("Alerts", timeout=WAIT_MS)
    for_key = page.get_by_label("For key")
    expect(for_key.locator("option")).to_have_text(["The whole account", f"ci ({ci['masked_key']})"], timeout=WAIT_MS)
    for_key.select_option(label=f"ci ({ci['masked_key']})")
    page.get_by_label("Threshold (% of quota)").fill("90")
    page.get_by_role("button", name="Add rule").click()
    key_rule = page.locator("#rules-table tbody tr", has_text="90%")
    expect(key_rule.locator(".rule-scope")).to_have_text(f"Key ci ({ci['masked_key']})", timeout=WAIT_MS)
    for_key.select_option(label="The whole account")
    page.get_by_label("Threshold (% of quota)").fill("70")
    page.get_by_role("button", name="Add rule").click()
    account_rule = page.locator("#rules-table tbody tr", has_text="70%")
    expect(account_rule.locator(".rule-scope")).to_have_text("Account", timeout=WAIT_MS)
    rules = api.get("/api/ai/usage/alert", headers=session).json()["rules"]
    assert {r["threshold_pct"]: r.get("scope") for r in rules} == {90: {"api_key_id": ci["id"]}, 70: None}
    shot(page, "alerts-key-scope")

    # ---- the activity log's badge ----------------------------------------------------------------
    page.goto(f"{base}/console/usage")
    rows = page.locator("#activity-table tbody tr")
    badge_row = rows.filter(has=page.locator(".status-flagged"))
    expect(badge_row).to_have_count(1, timeout=WAIT_MS)
    expect(badge_row).to_contain_text("anthropic/claude-x")
    expect(badge_row).to_contain_text("sk-nrrw...only")
    expect(badge_row.locator(".status-flagged")).to_have_text("Model not allowed")
    expect(rows.filter(has_text="openai/gpt-4o")).to_have_count(0)  # allowed usage is not listed
    badge_row.scroll_into_view_if_needed()
    shot(page, "activity-model-not-allowed")
    assert page_errors == []
    context.close()
