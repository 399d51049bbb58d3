"""The console's Audit log page in a real browser (Chromium through Playwright) against a real
`tollgate serve`: an owner creates and disables a key in the console, opens the Audit log, sees
both entries with its e-mail, filters by action; a viewer has no link and is told why.
Screenshots go to artifacts/screenshots/."""

import uuid

import httpx
import pytest
from playwright.sync_api import Browser, expect

from tests.e2e.console import (
    PASSWORD,
    PHONE,
    WAIT_MS,
    expect_page,
    no_sideways_scroll,
    open_console,
    open_page,
    poll,
    register,
    shot,
    sign_in,
)
from tests.support.apps import ServeProcess


@pytest.mark.integration
def test_an_owner_reads_and_filters_the_audit_log(server: ServeProcess, api: httpx.Client, browser: Browser) -> None:
    base = server.base_url
    owner = register(api, "owner", "Olive Owner")
    page, page_errors = open_console(browser, base)
    sign_in(page, base, owner.email)

    # ---- two writes in the console ----------------------------------------------------------------
    page.get_by_label("Name").fill("audited key")
    page.get_by_role("button", name="Create key").click()
    row = page.locator("#keys-table tbody tr", has_text="audited key")
    expect(row).to_have_count(1, timeout=WAIT_MS)
    page.get_by_role("button", name="Disable key audited key").click()
    expect(row).to_contain_text("Disabled", timeout=WAIT_MS)
    # the entries travel through the outbox and audit.v1
    poll(lambda: len(api.get("/api/audit-log", headers=owner.console).json()["items"]) >= 2, "the two audit entries")

    # ---- the Audit log shows both, newest first, with who did them ---------------------------------
    page.get_by_role("link", name="Audit log").click()
    expect_page(page, "Audit log")
    entries = page.locator("#audit-table tbody tr")
    expect(entries).to_have_count(2, timeout=WAIT_MS)
    expect(entries.nth(0)).to_contain_text("API key enabled/disabled")
    expect(entries.nth(1)).to_contain_text("API key created")
    expect(entries.nth(1)).to_contain_text(owner.email)
    expect(entries.nth(1)).to_contain_text("name: audited key")
    shot(page, "audit-log")

    # ---- filter by action ---------------------------------------------------------------------------
    page.locator("#audit-action").select_option("api_key.created")
    page.get_by_role("button", name="Filter").click()
    expect(entries).to_have_count(1, timeout=WAIT_MS)
    expect(entries.first).to_have_attribute("data-action", "api_key.created")
    page.locator("#audit-action").select_option("order.paid")
    page.get_by_role("button", name="Filter").click()
    expect(page.get_by_text("No entries match these filters.")).to_be_visible(timeout=WAIT_MS)
    # The filter names every action by its label, also those no account's log can hold: the
    # platform's service-token entries and a restore's account.deleted (docs/api.md, "Audit log").
    for label, action in (("Service token revoked", "service_token.revoked"), ("Account deleted (restore)", "account.deleted")):
        page.locator("#audit-action").select_option(label=label)
        with page.expect_response(lambda r, action=action: f"action={action}" in r.url) as listed:
            page.get_by_role("button", name="Filter").click()
        assert listed.value.status == 200 and listed.value.json()["items"] == []
    expect(page.get_by_text("No entries match these filters.")).to_be_visible()

    page.set_viewport_size(PHONE)
    open_page(page, base, "audit", "Audit log")
    expect(entries).to_have_count(2, timeout=WAIT_MS)
    shot(page, "audit-log")
    no_sideways_scroll(page, "the audit log")
    assert page_errors == [], page_errors
    page.context.close()

    # ---- a viewer: no link, and the page says why ----------------------------------------------------
    viewer_email = f"viewer-{uuid.uuid4().hex[:8]}@example.com"
    member = {"email": viewer_email, "name": "Vera Viewer", "password": PASSWORD, "role": "viewer"}
    assert api.post("/api/account/members", json=member, headers=owner.console).status_code == 201
    page, page_errors = open_console(browser, base)
    sign_in(page, base, viewer_email)
    expect(page.get_by_role("link", name="Audit log")).to_be_hidden()
    open_page(page, base, "audit", "Audit log")
    expect(page.locator("#audit-denied")).to_contain_text("only owners and billing members", timeout=WAIT_MS)
    expect(page.locator("#audit-table")).to_have_count(0)
    assert page_errors == [], page_errors
    page.context.close()
