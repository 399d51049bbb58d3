"""The console's Members page in a real browser (Chromium through Playwright) against a real
`tollgate serve`: an owner lists the members, adds a developer, changes its role, removes it; the
removed member's session is refused at once. Screenshots go to artifacts/screenshots/."""

import uuid

import httpx
import pytest
from playwright.sync_api import Browser, expect

from tests.e2e.console import (
    PASSWORD,
    PHONE,
    WAIT_MS,
    bearer,
    expect_page,
    no_sideways_scroll,
    open_console,
    open_page,
    register,
    shot,
    sign_in,
)
from tests.support.apps import ServeProcess


@pytest.mark.integration
def test_an_owner_manages_members_in_the_browser(server: ServeProcess, api: httpx.Client, browser: Browser) -> None:
    base = server.base_url
    owner = register(api, "owner", "Olive Owner")
    page, page_errors = open_console(browser, base)
    sign_in(page, base, owner.email)

    # ---- list: the owner alone ---------------------------------------------------------------
    page.get_by_role("link", name="Members").click()
    expect_page(page, "Members")
    rows = page.locator("#members-table tbody tr")
    expect(rows).to_have_count(1, timeout=WAIT_MS)
    expect(rows.first).to_contain_text("Olive Owner")

    # ---- add a developer ---------------------------------------------------------------------
    dev_email = f"dev-{uuid.uuid4().hex[:8]}@example.com"
    page.get_by_label("Member name").fill("Dev Robot")
    page.get_by_label("Member email").fill(dev_email)
    page.get_by_label("Initial password").fill(PASSWORD)
    page.locator("#member-role").select_option("developer")
    page.get_by_role("button", name="Add member").click()
    dev_row = page.locator("#members-table tbody tr", has_text="Dev Robot")
    expect(dev_row).to_have_count(1, timeout=WAIT_MS)
    expect(dev_row.get_by_label("Role of Dev Robot")).to_have_value("developer")
    shot(page, "members")
    dev_login = api.post("/api/auth/login", json={"email": dev_email, "password": PASSWORD})
    assert dev_login.status_code == 200
    dev_session = bearer(dev_login.json()["access_token"])
    assert api.get("/api/account", headers=dev_session).json()["role"] == "developer"

    # ---- the last owner cannot step down: the error is shown in words --------------------------
    owner_row = page.locator("#members-table tbody tr", has_text="Olive Owner")
    owner_row.get_by_label("Role of Olive Owner").select_option("viewer")
    expect(page.get_by_role("alert")).to_contain_text("last owner", timeout=WAIT_MS)
    expect(owner_row.get_by_label("Role of Olive Owner")).to_have_value("owner")

    # ---- change the developer's role ---------------------------------------------------------
    dev_row.get_by_label("Role of Dev Robot").select_option("viewer")
    expect(page.get_by_role("status")).to_contain_text("Dev Robot is now Viewer", timeout=WAIT_MS)
    assert api.get("/api/account", headers=dev_session).json()["roles"] == ["viewer"]

    # ---- remove it: its session ends at once -------------------------------------------------
    page.get_by_role("button", name="Remove member Dev Robot").click()
    page.get_by_role("dialog").get_by_role("button", name="Remove member").click()
    expect(page.locator("#members-table tbody tr", has_text="Dev Robot")).to_have_count(0, timeout=WAIT_MS)
    gone = api.get("/api/account", headers=dev_session)
    assert gone.status_code == 401 and gone.json()["error"]["code"] == "invalid_session"
    shot(page, "members-after-removal")

    page.set_viewport_size(PHONE)
    open_page(page, base, "members", "Members")
    page.wait_for_load_state("networkidle")
    shot(page, "members")
    no_sideways_scroll(page, "members")
    assert page_errors == [], page_errors
    page.context.close()
