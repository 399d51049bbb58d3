"""The console's Audit log page in a real browser (Chromium through Playwright) against a real
`tollgate serve`: an owner creates and disables a key in the console, opens the Audit log, sees
both entries with its e-mail, filters by action; a viewer has no link and is told why.
Screenshots go to artifacts/screenshots/."""

import time
import uuid

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.e2e.test_console import LAPTOP, PHONE, WAIT_MS, browser, open_page, server, shot  # noqa: F401 (fixtures)
from tests.support.apps import ServeProcess

PASSWORD = "correct horse battery"


def _sign_in(page: Page, base: str, email: str) -> None:
    page.goto(f"{base}/console/signin")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("API keys", timeout=WAIT_MS)


def _stored(api: httpx.Client, session: dict[str, str], count: int) -> None:
    """Until the account's log holds `count` entries (they travel through the outbox and audit.v1)."""
    deadline = time.monotonic() + 20
    while len(api.get("/api/audit-log", headers=session).json()["items"]) < count:
        assert time.monotonic() < deadline, "the audit entries did not arrive"
        time.sleep(0.05)  # a poll's pause, not a wait for anything


@pytest.mark.integration
def test_an_owner_reads_and_filters_the_audit_log(server: ServeProcess, browser: Browser) -> None:  # noqa: F811
    base = server.base_url
    api = httpx.Client(base_url=base, timeout=10)
    email = f"owner-{uuid.uuid4().hex[:8]}@example.com"
    body = {"email": email, "password": PASSWORD, "name": "Olive Owner", "user_type": "individual"}
    assert api.post("/api/auth/register", json=body).status_code == 201
    token = api.post("/api/auth/login", json={"email": email, "password": PASSWORD}).json()["access_token"]
    owner = {"Authorization": f"Bearer {token}"}

    context = browser.new_context(viewport=LAPTOP, base_url=base)
    page = context.new_page()
    page_errors: list[str] = []
    page.on("pageerror", lambda exc: page_errors.append(str(exc)))
    _sign_in(page, base, email)

    # ---- two writes in the console ----------------------------------------------------------------
    page.get_by_label("Name").fill("audited key")
    page.get_by_role("button", name="Create key").click()
    row = page.locator("#keys-table tbody tr", has_text="audited key")
    expect(row).to_have_count(1, timeout=WAIT_MS)
    page.get_by_role("button", name="Disable key audited key").click()
    expect(row).to_contain_text("Disabled", timeout=WAIT_MS)
    _stored(api, owner, 2)

    # ---- the Audit log shows both, newest first, with who did them ---------------------------------
    page.get_by_role("link", name="Audit log").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Audit log", timeout=WAIT_MS)
    entries = page.locator("#audit-table tbody tr")
    expect(entries).to_have_count(2, timeout=WAIT_MS)
    expect(entries.nth(0)).to_contain_text("API key enabled/disabled")
    expect(entries.nth(1)).to_contain_text("API key created")
    expect(entries.nth(1)).to_contain_text(email)
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

    page.set_viewport_size(PHONE)
    open_page(page, base, "audit", "Audit log")
    expect(entries).to_have_count(2, timeout=WAIT_MS)
    shot(page, "audit-log")
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1, f"the audit log scrolls sideways by {overflow}px at phone width"
    assert page_errors == [], page_errors
    context.close()

    # ---- a viewer: no link, and the page says why ----------------------------------------------------
    viewer_email = f"viewer-{uuid.uuid4().hex[:8]}@example.com"
    member = {"email": viewer_email, "name": "Vera Viewer", "password": PASSWORD, "role": "viewer"}
    assert api.post("/api/account/members", json=member, headers=owner).status_code == 201
    context = browser.new_context(viewport=LAPTOP, base_url=base)
    page = context.new_page()
    _sign_in(page, base, viewer_email)
    expect(page.get_by_role("link", name="Audit log")).to_be_hidden()
    open_page(page, base, "audit", "Audit log")
    expect(page.locator("#audit-denied")).to_contain_text("only owners and billing members", timeout=WAIT_MS)
    expect(page.locator("#audit-table")).to_have_count(0)
    context.close()
