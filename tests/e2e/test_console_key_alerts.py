"""(v4) Key-scoped alert rules and the activity log's flag in a real browser against a real
`tollgate serve`: the alerts page offers "For key" with the account's keys, makes a rule that
watches one key and one that watches the account, and lists each rule's scope (the key by its
name and masked key); the usage page's activity log marks usage of a model its key does not allow
with a badge. Screenshots go to artifacts/screenshots/.

The key narrowed to `openai/*` is stated on keys.v1 directly (as the keys service publishes a key's
rules), so this story does not depend on the keys page's form."""

import hashlib
import secrets
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from playwright.sync_api import Browser, expect

from contracts.common import KeyStatus, Resource, Role
from contracts.events import KeyState, UsageEvent
from contracts.topics import KEYS, USAGE
from services.runtime.platform.settings import Settings
from tests.e2e.console import WAIT_MS, create_key, open_console, open_page, poll, register, run_beside, shot, sign_in
from tests.integration.quota_helpers import publish
from tests.support.apps import ServeProcess


@pytest.mark.integration
def test_a_rule_for_one_key_is_made_and_listed_with_its_key_and_flagged_usage_shows_a_badge(
    server: ServeProcess, api: httpx.Client, browser: Browser, settings: Settings
) -> None:
    base = server.base_url
    user = register(api, "keyalerts", "Key alerts")
    account_id, session = user.account_id, user.console
    ci = create_key(api, session, "ci")

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
    run_beside(publish(settings, KEYS.name, [narrow], key=lambda s: str(s.key_id)))

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
    denied_and_allowed = [usage("claude-x", "anthropic", 20), usage("gpt-4o", "openai", 10)]
    run_beside(publish(settings, USAGE.name, denied_and_allowed, key=lambda e: str(e.account_id)))
    poll(flagged, "the flagged usage in the activity log", timeout=30)

    page, page_errors = open_console(browser, base)
    sign_in(page, base, user.email)

    # ---- alerts: one rule for the ci key, one for the account ----------------------------------
    open_page(page, base, "alerts", "Alerts")
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
    open_page(page, base, "usage", "Usage")
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
    page.context.close()
