"""The console in a real browser (the machine's Chromium through Playwright) against a real
`tollgate serve` process on real Kafka, Postgres and ClickHouse.

One story, as a user would live it: register, create a key and see it once, call the API with it,
watch the activity log and usage move, disable it and see the call fail, exhaust a quota (red
band, 403), upgrade and see it clear, find the next period's renewal (made by billing's renewal
job) in the order history, add an alert and receive the in-site notification.
Screenshots of every page at laptop and phone width go to artifacts/screenshots/.
"""

import csv
import io
import json
import re
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from playwright.sync_api import Browser, expect

from contracts.period import bounds_of
from services import console
from services.alerts.webhook import verify
from services.edge.errors import install_error_handlers
from services.runtime.platform.settings import Settings
from tests.e2e.console import (
    LAPTOP,
    PASSWORD,
    PHONE,
    SCREENSHOTS,
    WAIT_MS,
    bearer,
    expect_page,
    no_sideways_scroll,
    open_console,
    open_page,
    poll,
    poll_clicking,
    renew_plans,
    run_beside,
    service_token,
    shot,
    usage_event,
)
from tests.support.apps import ServeProcess


@pytest.mark.integration
def test_a_user_manages_keys_quota_usage_alerts_and_plan_in_the_browser(
    server: ServeProcess,
    api: httpx.Client,
    browser: Browser,
    settings: Settings,
    webhook_receiver: tuple[str, list[tuple[dict[str, str], bytes]]],
) -> None:
    base = server.base_url
    page, page_errors = open_console(browser, base)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base)
    # The platform service (an AI gateway) that admits the user's key and reports the usage it
    # caused holds a service token.
    service = bearer(service_token(api, settings, "ai-gateway", ("usage:write", "keys:verify")))

    # ---- sign in / register ----------------------------------------------------------------
    page.goto(f"{base}/console")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible(timeout=WAIT_MS)
    shot(page, "signin")
    page.get_by_role("link", name="Create an account").click()
    expect(page.get_by_role("heading", name="Create an account")).to_be_visible()
    shot(page, "register")
    email = f"ada-{uuid.uuid4().hex[:8]}@example.com"
    page.get_by_label("Name").fill("Ada Lovelace")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_label("Individual").check()
    page.get_by_role("button", name="Create account").click()
    expect_page(page, "API keys")
    token = page.evaluate("sessionStorage.getItem('tollgate.session')")
    assert token and not token.startswith("sk-")
    account = api.get("/api/account", headers=bearer(token)).json()
    assert account["email"] == email and account["user_type"] == "individual" and account["plan"] == "free"

    # ---- create a key: the full secret is on screen once, with a copy button -----------------
    page.get_by_label("Name").fill("ci key")
    page.get_by_role("button", name="Create key").click()
    secret_box = page.get_by_label("Full API key for ci key")
    expect(secret_box).to_be_visible(timeout=WAIT_MS)
    secret = secret_box.input_value()
    assert re.fullmatch(r"sk-[A-Za-z0-9_-]{40,}", secret), secret
    expect(page.get_by_text("shown only this once")).to_be_visible()
    page.get_by_role("button", name="Copy key").click()
    expect(page.get_by_role("button", name="Copied")).to_be_visible()
    assert page.evaluate("navigator.clipboard.readText()") == secret
    shot(page, "keys-new-secret")
    page.get_by_role("button", name="I have stored it").click()
    masked = f"sk-{secret[3:7]}...{secret[-4:]}"
    row = page.locator("#keys-table tbody tr", has_text="ci key")
    expect(row).to_contain_text(masked)
    expect(row).to_contain_text("Enabled")
    assert secret not in page.content()
    page.reload()
    expect(page.locator("#keys-table tbody tr", has_text="ci key")).to_contain_text(masked, timeout=WAIT_MS)
    assert secret not in page.content()  # never shown again
    shot(page, "keys")

    # ---- use it from a program: calls; the platform reports the usage they caused -----------
    key = bearer(secret)
    for _ in range(2):
        assert api.get("/api/geo/projects", headers=key).status_code == 200
    # (v3) the AI gateway admits a call with the key through verify: a metered call it names
    call = {"key": secret, "method": "POST", "path": "/v1/chat/completions", "ip": "203.0.113.9", "user_agent": "sdk/2"}
    verified = api.post("/api/edge/verify", headers=service, json=call)
    assert verified.status_code == 200 and verified.json()["valid"] is True, verified.text
    events = [
        usage_event(account["id"], 1200, 300, "openai", "gpt-4o"),
        usage_event(account["id"], 600, 400, "anthropic", "claude-sonnet"),
    ]
    session = bearer(token)
    (key_id,) = [k["id"] for k in api.get("/api/api-keys", headers=session).json()["items"] if k["name"] == "ci key"]
    for e in events:  # the events name the key that caused them (usage per key)
        e["api_key_id"] = key_id

    refused = api.post("/api/usage/events", headers=key, json={"events": events})  # never its own meter
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "permission_denied", refused.text
    ingest = api.post("/api/usage/events", headers=service, json={"events": events})
    assert ingest.status_code == 202, ingest.text

    # ---- the usage page and activity log update ----------------------------------------------
    open_page(page, base, "usage", "Usage")
    show = page.get_by_role("button", name="Show")
    total = page.locator("#usage-overview .stat", has_text="Total tokens").locator(".stat-value")

    def total_tokens() -> str:
        return total.inner_text(timeout=WAIT_MS).replace(",", "")

    poll_clicking(show, lambda: total_tokens() == "2500", "the usage overview to count 2,500 tokens")
    # The overview's calls are the model calls reported as usage, not the API calls quota.
    model_calls = page.locator("#usage-overview .stat", has_text="Model calls")
    expect(model_calls.locator(".stat-value")).to_have_text("2")
    expect(model_calls).to_contain_text("Not the API calls quota")
    expect(page.locator("#provider-table")).to_contain_text("gpt-4o", timeout=WAIT_MS)  # its own request
    expect(page.locator("#provider-table")).to_contain_text("anthropic")
    expect(page.get_by_role("img", name=re.compile("Share of tokens by model"))).to_be_visible()
    expect(page.locator(".line-chart polyline")).to_have_count(2)

    page.get_by_text("This month", exact=True).click()  # a range change reloads at once
    expect(page.get_by_label("Granularity")).to_have_value("day")
    expect(total).to_have_text("2,500")

    filter_button = page.get_by_role("button", name="Filter")
    activity = page.locator("#activity-table tbody tr")

    def activity_shows_calls() -> bool:
        return activity.filter(has_text="/api/geo/projects").count() >= 2 and activity.filter(has_text="/v1/chat").count() >= 1

    poll_clicking(filter_button, activity_shows_calls, "the activity log to list the key's calls")
    expect(activity.filter(has_text="console-e2e/1.0").first).to_be_visible()
    gateway_call = activity.filter(has_text="/v1/chat/completions")  # the service that verified it
    expect(gateway_call.locator("td[data-label='Service']")).to_have_text("ai-gateway", timeout=WAIT_MS)
    page.get_by_label("API key").select_option(label=f"ci key ({masked})")
    filter_button.click()
    expect(activity.filter(has_text=masked).first).to_be_visible()
    shot(page, "usage")

    # ---- usage per key, honest numbers, export ------------------------------------------------
    # claude-sonnet has no price: it says "unpriced", never a silent 0; the trend says how fresh it is.
    expect(page.locator("#provider-table tr", has_text="claude-sonnet")).to_contain_text("unpriced")
    expect(page.locator("#usage-overview")).to_contain_text("1,000 tokens unpriced")
    expect(page.locator("#trend-as-of")).to_contain_text("Data as of")
    expect(page.locator("#trend-as-of .unpriced")).to_have_text("unpriced")
    # Usage reported by the account itself, without a key: "All keys" counts it, the key filter not.
    keyless = api.post(
        "/api/usage/events", headers=service, json={"events": [usage_event(account["id"], 400, 100, "openai", "gpt-4o")]}
    )
    assert keyless.status_code == 202, keyless.text

    poll_clicking(show, lambda: total_tokens() == "3000", "the overview to count the key-less 500 tokens")
    page.get_by_label("Show usage of").select_option(label=f"ci key ({masked})")  # reloads at once
    expect(total).to_have_text("2,500", timeout=WAIT_MS)
    page.get_by_label("Rows").select_option("api_key")
    expect(page.locator("#provider-table tr", has_text="gpt-4o")).to_contain_text(f"ci key ({masked})", timeout=WAIT_MS)
    shot(page, "usage-per-key")
    with page.expect_download() as download:
        page.get_by_role("button", name="Export by provider as CSV").click()
    assert download.value.suggested_filename == "usage-by-provider.csv"
    rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
    assert sorted(
        (r["provider"], r["model"], r["api_key_id"], r["masked_key"], r["total_tokens"], r["priced"]) for r in rows
    ) == [
        ("anthropic", "claude-sonnet", key_id, masked, "1000", "false"),
        ("openai", "gpt-4o", key_id, masked, "1500", "true"),
    ]
    assert [r["estimated_cost"] for r in rows if r["model"] == "claude-sonnet"] == [""]  # unpriced: no cost
    with page.expect_download() as download:
        page.get_by_role("button", name="Export trend as CSV").click()
    rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
    assert {r["key"] for r in rows} == {"anthropic/claude-sonnet", "openai/gpt-4o"}  # model series: provider/model
    assert sum(int(r["total_tokens"]) for r in rows) == 2500  # the key's usage only
    page.get_by_label("Show usage of").select_option("")
    expect(total).to_have_text("3,000", timeout=WAIT_MS)

    # ---- toggle the key off: the call fails at once; back on: it works ----------------------
    open_page(page, base, "keys", "API keys")
    page.get_by_role("button", name="Disable key ci key").click()
    expect(page.locator("#keys-table tbody tr", has_text="ci key")).to_contain_text("Disabled", timeout=WAIT_MS)
    refused = api.get("/api/geo/projects", headers=key)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "api_key_disabled"
    page.get_by_role("button", name="Enable key ci key").press("Enter")  # by keyboard
    expect(page.locator("#keys-table tbody tr", has_text="ci key")).to_contain_text("Enabled", timeout=WAIT_MS)
    assert api.get("/api/geo/projects", headers=key).status_code == 200

    # ---- the refused call is in the activity log, with its code, under the "Refused" outcome --
    open_page(page, base, "usage", "Usage")
    page.get_by_label("Outcome").select_option(label="Refused")
    refused_rows = page.locator("#activity-table tbody tr")
    poll_clicking(
        page.get_by_role("button", name="Filter"),
        lambda: refused_rows.filter(has_text="api_key_disabled").count() >= 1,
        "the activity log to list the refused call",
    )
    expect(refused_rows).to_have_count(1)  # only the refusal: the admitted calls are filtered out
    expect(refused_rows.first).to_contain_text("401")
    page.get_by_label("Outcome").select_option(label="Admitted")
    page.get_by_role("button", name="Filter").click()
    expect(refused_rows.filter(has_text="/api/geo/projects").first).to_be_visible()
    expect(refused_rows.filter(has_text="api_key_disabled")).to_have_count(0)

    # ---- exhaust a quota: red band in the console and 403 from the API ----------------------
    for n in range(3):  # the free plan allows 3 GEO projects
        created = api.post("/api/geo/projects", headers=key, json={"name": f"site {n}"})
        assert created.status_code == 201, created.text

    blocked = api.post("/api/geo/projects", headers=key, json={"name": "one too many"})  # exact: at once
    assert blocked.status_code == 403 and blocked.json()["error"]["code"] == "insufficient_quota"
    details = blocked.json()["error"]["details"]
    assert (details["resource"], details["used"], details["total"]) == ("geo_projects", 3, 3)

    geo = page.locator('.quota-card[data-resource="geo_projects"]')

    def quota_page_shows_geo_exhausted() -> bool:
        # geo refused the 4th at once; the quota counters learn the 3rd through usage.v1 (the page
        # reads them once per load)
        open_page(page, base, "quota", "Quota")
        return geo.get_attribute("data-band", timeout=WAIT_MS) == "red"

    poll(quota_page_shows_geo_exhausted, "the quota page to show geo_projects exhausted")
    expect(geo).to_contain_text("Exhausted")
    expect(geo.get_by_role("progressbar")).to_have_attribute("aria-valuenow", "100")
    expect(page.locator('.quota-card[data-resource="api_calls"]')).to_have_attribute("data-band", "green")
    expect(page.locator("#quota-period")).to_contain_text("reset")
    shot(page, "quota")
    # The console's error box shows what a 403 insufficient_quota says: used of total, the way out.
    page.evaluate(
        """async (error) => {
            const { errorBox } = await import("/console/assets/dom.js");
            const { ApiError } = await import("/console/assets/api.js");
            const box = errorBox(new ApiError(403, error.code, error.message, error.details, error.request_id));
            box.id = "quota-error";
            document.querySelector("main").prepend(box);
        }""",
        blocked.json()["error"],
    )
    quota_error = page.locator("#quota-error")
    expect(quota_error).to_contain_text("GEO projects: 3 of 3 used.")
    expect(quota_error.get_by_role("link", name="Upgrade plan")).to_have_attribute("href", f"{base}/console/plan")
    expect(quota_error.get_by_role("link", name="Buy quota package")).to_have_attribute(
        "href", f"{base}/console/quota?buy=geo_projects"
    )
    shot(page, "quota-insufficient")
    page.evaluate("document.getElementById('quota-error').remove()")

    # ---- plan: the individual/enterprise rule explained, then upgrade with proration shown ---
    page.get_by_role("link", name="Upgrade plan").click()
    expect_page(page, "Plan & account")
    expect(page.locator("#current-plan")).to_have_text("Free", timeout=WAIT_MS)
    page.get_by_role("button", name="Upgrade to Enterprise").click()
    mismatch = page.locator("#plan-mismatch")
    expect(mismatch).to_be_visible(timeout=WAIT_MS)
    expect(mismatch).to_contain_text("Your account's user type is individual")
    shot(page, "plan-mismatch")
    with page.expect_request(lambda r: r.url.endswith("/api/billing/orders") and r.method == "POST") as ordered:
        page.get_by_role("button", name="Upgrade to Basic").click()
    order_key = ordered.value.headers.get("idempotency-key", "")
    assert re.fullmatch(r"[0-9a-f-]{32,36}", order_key), order_key  # one per user action
    amount = page.locator("#order-amount")
    expect(amount).to_have_text(re.compile(r"^\d+\.\d{2} USD$"), timeout=WAIT_MS)
    assert 0 < float(amount.inner_text().split()[0]) <= 9.90  # the price difference, prorated
    shown_amount = amount.inner_text()
    shot(page, "plan-checkout")
    with page.expect_request(lambda r: r.url.endswith("/pay")) as paid:
        page.get_by_role("button", name=re.compile(r"^Pay ")).click()
    pay_key = paid.value.headers.get("idempotency-key", "")
    assert re.fullmatch(r"[0-9a-f-]{32,36}", pay_key) and pay_key != order_key
    expect(page.locator("#current-plan")).to_have_text("Basic", timeout=WAIT_MS)
    shot(page, "plan")

    # ---- money users can check: package prices, the order history, the printable invoice -------
    expect(page.locator('#packages-table tr[data-resource="ai_tokens"]')).to_contain_text("1.00 USD", timeout=WAIT_MS)
    paid_order = page.locator('#orders-table tbody tr[data-status="paid"]')
    expect(paid_order).to_have_count(1, timeout=WAIT_MS)
    expect(paid_order).to_contain_text("Upgrade Free → Basic")
    expect(paid_order).to_contain_text(shown_amount)  # the amount shown before paying is the one paid
    page.locator("#orders-title").scroll_into_view_if_needed()
    shot(page, "plan-orders")
    with page.expect_popup() as opened:
        paid_order.get_by_role("button", name=re.compile(r"^Invoice")).click()
    invoice = opened.value
    expect(invoice.locator("#invoice-number")).to_have_text(re.compile(r"^TG-\d{6}$"), timeout=WAIT_MS)
    expect(invoice.locator("#invoice-total")).to_have_text(shown_amount)
    expect(invoice.get_by_role("heading", name="Invoice")).to_be_visible()
    # its stylesheet applied (it loads after the written document: waited for, not assumed). Not
    # wait_for_function: its string predicate is eval'd in the page, which the console's CSP refuses.
    expect(invoice.locator("body")).to_have_css("max-width", "768px", timeout=WAIT_MS)  # invoice.css 48rem
    invoice.screenshot(path=str(SCREENSHOTS / "invoice-laptop.png"), full_page=True)
    invoice.close()

    # ---- the next period: billing's renewal job charges Basic in full, listed as its renewal ----
    _, _, period_end = bounds_of(datetime.now(UTC), settings.tz)
    run_beside(renew_plans(settings, period_end + timedelta(seconds=30)))
    open_page(page, base, "plan", "Plan & account")
    renewal = page.locator("#orders-table tbody tr", has_text="Basic plan renewal")
    expect(renewal).to_have_attribute("data-status", "paid", timeout=WAIT_MS)
    expect(renewal).to_contain_text("9.90 USD")  # the plan's full monthly price
    expect(renewal.get_by_role("button", name="Invoice of Basic plan renewal")).to_be_visible()
    expect(page.locator("#orders-table tbody tr")).to_have_count(2)  # newest first: the renewal, the upgrade
    expect(page.locator("#orders-table tbody tr").nth(1)).to_contain_text("Upgrade Free → Basic")

    def project_allowed_again() -> bool:
        return api.post("/api/geo/projects", headers=key, json={"name": "after upgrade"}).status_code == 201

    poll(project_allowed_again, "GEO projects to be allowed after the upgrade")
    open_page(page, base, "quota", "Quota")
    expect(geo).to_have_attribute("data-band", "green", timeout=WAIT_MS)
    expect(geo).to_contain_text("Available")

    # ---- alerts: a rule, then the crossing, then the in-site notification -------------------
    open_page(page, base, "alerts", "Alerts")
    page.get_by_label("Metric").select_option("total_tokens")
    page.get_by_label("Threshold (% of quota)").fill("50")
    page.get_by_role("button", name="Add rule").click()
    rule = page.locator("#rules-table tbody tr", has_text="Total tokens")
    expect(rule).to_contain_text("50%", timeout=WAIT_MS)
    expect(rule).to_contain_text("Not fired")
    # Basic allows 1,000,000 AI tokens: 600,000 more crosses 50%.
    crossing = api.post(
        "/api/usage/events",
        headers=service,
        json={"events": [usage_event(account["id"], 400_000, 200_000, "openai", "gpt-4o")]},
    )
    assert crossing.status_code == 202, crossing.text
    notes = page.locator("#notifications .notification")
    poll_clicking(page.get_by_role("button", name="Refresh"), lambda: notes.count() > 0, "the in-site notification", timeout=30)
    expect(notes.first).to_contain_text("50%")
    expect(notes.first.get_by_role("link", name="Upgrade plan")).to_have_attribute("href", f"{base}/console/plan")
    expect(page.locator("#unread")).to_have_text("1")
    shot(page, "alerts")
    mark_read = notes.first.get_by_role("button", name=re.compile(r"^Mark .* as read$"))
    mark_read.click()  # read in the inbox: the badge clears and the button goes
    expect(page.locator("#unread")).to_be_hidden(timeout=WAIT_MS)
    expect(notes.first).not_to_have_class(re.compile(r"\bunread\b"))
    expect(mark_read).to_have_count(0)
    notes.first.get_by_role("link", name="Buy quota package").click()  # the quick link opens the package form
    expect(page.get_by_role("heading", name="Buy a quota package")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#buy-package select")).to_have_value("ai_tokens")
    page.get_by_label("Amount").fill("100000")
    page.get_by_role("button", name="See the price").click()
    pay_package = page.get_by_role("button", name=re.compile(r"^Pay \d+\.\d{2} USD$"))
    expect(pay_package).to_be_visible(timeout=WAIT_MS)
    pay_package.click()
    ai_tokens = page.locator('.quota-card[data-resource="ai_tokens"]')
    expect(ai_tokens).to_contain_text("1,100,000", timeout=WAIT_MS)  # the package is added to this period

    # ---- a webhook rule: the signing secret shown once, the delivery in the rule's log -------
    hook_url, hook_requests = webhook_receiver
    open_page(page, base, "alerts", "Alerts")
    page.get_by_label("Threshold (% of quota)").fill("10")  # passed already (600,000 of 1,100,000): fires at creation
    page.get_by_role("checkbox", name="In-site").uncheck()
    page.get_by_role("checkbox", name="Webhook").check()
    page.get_by_label("Webhook URL").fill(hook_url)
    page.get_by_role("button", name="Add rule").click()
    secret_field = page.get_by_role("textbox", name="Webhook signing secret")
    expect(secret_field).to_be_visible(timeout=WAIT_MS)
    expect(page.get_by_role("heading", name="Your webhook signing secret")).to_be_visible()
    expect(page.get_by_role("alert").filter(has_text="shown only this once")).to_be_visible()
    webhook_secret = secret_field.input_value()
    assert webhook_secret.startswith("whsec_")
    page.get_by_role("button", name="Copy secret").click()
    expect(page.get_by_role("button", name="Copied")).to_be_visible()
    assert page.evaluate("navigator.clipboard.readText()") == webhook_secret
    hook_rule = page.locator("#rules-table tbody tr", has_text="Webhook")
    expect(hook_rule).to_contain_text("10%", timeout=WAIT_MS)
    expect(hook_rule).to_contain_text(hook_url)
    shot(page, "alerts-webhook-secret")
    page.get_by_role("button", name="I have stored it").click()
    expect(secret_field).to_have_count(0)
    poll(lambda: len(hook_requests) > 0, "the webhook delivery", timeout=30)
    hook_headers, hook_body = hook_requests[0]
    assert verify(webhook_secret, hook_headers["tollgate-signature"], hook_body)
    assert json.loads(hook_body)["threshold_pct"] == 10
    hook_rule.get_by_role("button", name=re.compile(r"^Deliveries of the Total tokens 10% rule$")).click()
    log = page.locator("#deliveries-table tbody tr")
    expect(log).to_have_count(1, timeout=WAIT_MS)
    expect(log.first).to_contain_text("200")
    expect(log.first).to_contain_text(hook_url)
    expect(log.first).to_contain_text("sent")
    shot(page, "alerts-webhook-deliveries")
    page.reload()  # the secret is not shown again
    expect_page(page, "Alerts")
    expect(page.locator("#rules-table tbody tr", has_text="Webhook")).to_have_count(1, timeout=WAIT_MS)
    assert webhook_secret not in page.content()

    # ---- rotate without grace (new key shown once, old one dead), then delete with confirmation
    open_page(page, base, "keys", "API keys")
    page.get_by_label("Name").fill("temp key")
    page.get_by_role("button", name="Create key").click()
    old_secret = page.get_by_label("Full API key for temp key").input_value()
    page.get_by_role("button", name="I have stored it").click()
    page.get_by_role("button", name="Rotate key temp key").click()
    dialog = page.get_by_role("dialog", name="Rotate key “temp key”")
    dialog.get_by_label("Grace period for the old key").select_option("0")
    dialog.get_by_role("button", name="Rotate key").click()
    new_secret = page.get_by_label("Full API key for temp key").input_value()
    assert new_secret.startswith("sk-") and new_secret != old_secret
    page.get_by_role("button", name="I have stored it").click()
    expect(page.locator("#keys-table tbody tr", has_text="temp key")).to_have_count(1)
    assert api.get("/api/geo/projects", headers=bearer(old_secret)).status_code == 401
    assert api.get("/api/geo/projects", headers=bearer(new_secret)).status_code == 200
    page.get_by_role("button", name="Delete key temp key").click()
    confirm = page.get_by_role("dialog", name="Delete key “temp key”?")
    expect(confirm).to_contain_text("permanent")
    page.keyboard.press("Escape")  # the dialog is keyboard-operable: Escape cancels
    expect(confirm).to_be_hidden()
    expect(page.locator("#keys-table tbody tr", has_text="temp key")).to_have_count(1)
    page.get_by_role("button", name="Delete key temp key").click()
    page.get_by_role("dialog").get_by_role("button", name="Delete key").click()
    expect(page.locator("#keys-table tbody tr", has_text="temp key")).to_have_count(0, timeout=WAIT_MS)
    gone = api.get("/api/geo/projects", headers=bearer(new_secret))
    assert gone.status_code == 401 and gone.json()["error"]["code"] == "invalid_api_key"

    # ---- every page at phone width: readable, no sideways scrolling, menu works -------------
    page.set_viewport_size(PHONE)
    for route, heading in (
        ("keys", "API keys"),
        ("quota", "Quota"),
        ("usage", "Usage"),
        ("alerts", "Alerts"),
        ("plan", "Plan & account"),
    ):
        open_page(page, base, route, heading)
        page.wait_for_load_state("networkidle")
        shot(page, route)
        if route == "usage":  # the charts, close up, as a phone draws them
            page.locator("section", has=page.get_by_role("heading", name="Trend")).screenshot(
                path=str(SCREENSHOTS / "usage-trend-phone.png")
            )
        no_sideways_scroll(page, route)
    menu = page.get_by_role("button", name="Menu")
    expect(page.get_by_role("link", name="Quota")).to_be_hidden()
    menu.click()
    expect(menu).to_have_attribute("aria-expanded", "true")
    page.get_by_role("link", name="Quota").click()
    expect_page(page, "Quota")

    page.set_viewport_size(LAPTOP)

    # ---- an expired key is listed as expired -------------------------------------------------
    console_auth = bearer(page.evaluate("sessionStorage.getItem('tollgate.session')"))
    expires_at = datetime.now(UTC) + timedelta(seconds=1)
    made = api.post("/api/api-keys", json={"name": "short key", "expires_at": expires_at.isoformat()}, headers=console_auth)
    assert made.status_code == 201, made.text
    time.sleep(max(0.0, (expires_at - datetime.now(UTC)).total_seconds()) + 0.1)
    open_page(page, base, "keys", "API keys")
    short_row = page.locator("#keys-table tbody tr", has_text="short key")
    expect(short_row.locator(".status")).to_have_text("Expired", timeout=WAIT_MS)
    expect(short_row.get_by_role("button", name="Disable key short key")).to_have_count(0)
    shot(page, "keys-expired")

    # ---- change the password: a wrong current one is refused; then every session ends --------
    def account_status(headers: dict[str, str]) -> tuple[int, str | None]:
        response = api.get("/api/account", headers=headers)
        return response.status_code, response.json().get("error", {}).get("code") if response.status_code >= 400 else None

    other_session = bearer(api.post("/api/auth/login", json={"email": email, "password": PASSWORD}).json()["access_token"])
    open_page(page, base, "plan", "Plan & account")
    expect(page.locator("#account-id")).to_have_text(account["id"])  # what usage events name (README)
    password_form = page.get_by_role("form", name="Change password")
    password_form.get_by_label("Current password").fill("not my password")
    password_form.get_by_label("New password").fill("a much better passphrase")
    password_form.get_by_role("button", name="Change password").click()
    expect(password_form.get_by_role("alert")).to_contain_text("current password is wrong", timeout=WAIT_MS)
    assert account_status(console_auth) == (200, None)
    password_form.get_by_label("Current password").fill(PASSWORD)
    password_form.get_by_role("button", name="Change password").click()
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible(timeout=WAIT_MS)
    assert page.evaluate("sessionStorage.getItem('tollgate.session')") is None
    for ended in (console_auth, other_session):  # this browser's session and another one
        assert account_status(ended) == (401, "invalid_session")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_be_visible(timeout=WAIT_MS)  # the old password no longer works
    page.get_by_label("Password").fill("a much better passphrase")
    page.get_by_role("button", name="Sign in").click()
    expect_page(page, "API keys")
    new_auth = bearer(page.evaluate("sessionStorage.getItem('tollgate.session')"))
    assert account_status(new_auth) == (200, None)

    # ---- log out: the session ends on the server and is gone from the browser ----------------
    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible(timeout=WAIT_MS)
    assert page.evaluate("sessionStorage.getItem('tollgate.session')") is None
    assert account_status(new_auth) == (401, "invalid_session")
    shot(page, "signin")
    page.goto(f"{base}/console/register")
    shot(page, "register")
    assert page_errors == [], page_errors
    page.context.close()


async def test_the_console_is_served_same_origin_only() -> None:
    """No CDN, no inline script: a CSP that allows only this origin, and pages for deep links."""
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(console.router())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://console.test") as client:
        index = await client.get("/console/alerts")
        assert index.status_code == 200 and "text/html" in index.headers["content-type"]
        csp = index.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "script-src 'self'" in csp
        # never framed by another site (clickjacking): CSP for today's browsers, X-Frame-Options for the rest
        assert "frame-ancestors 'none'" in csp and index.headers["x-frame-options"] == "DENY"
        assert (await client.get("/console/assets/app.js")).headers["content-type"].startswith("text/javascript")
        assert (await client.get("/console/assets/..%2F__init__.py")).status_code == 404
        assert (await client.get("/console/assets/__init__.py")).status_code == 404
        assert (await client.get("/console/nowhere")).status_code == 404
    for asset in console.STATIC.iterdir():
        text = asset.read_text()
        assert not re.search(r"(src|href)=\"https?://", text), f"{asset.name} loads something from another host"
        assert "<script>" not in text, f"{asset.name} has an inline script"
