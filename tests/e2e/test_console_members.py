"""The console's Members page in a real browser (Chromium through Playwright) against a real
`tollgate serve`: an owner lists the members, adds a developer, changes its role, removes it; the
removed member's session is refused at once. Screenshots go to artifacts/screenshots/."""

import uuid

import httpx
import pytest
from playwright.sync_api import Browser, expect

from tests.e2e.test_console import LAPTOP, PHONE, WAIT_MS, browser, open_page, server, shot  # noqa: F401 (fixtures)
from tests.support.apps import ServeProcess

PASSWORD = "correct horse battery"


@pytest.mark.integration
def test_an_owner_manages_members_in_the_browser(server: ServeProcess, browser: Browser) -> None:  # noqa: F811
    base = server.base_url
    api = httpx.Client(base_url=base, timeout=10)
    email = f"owner-{uuid.uuid4().hex[:8]}@example.com"
    registered = api.post(
        "/api/auth/register", json={"email": email, "password": PASSWORD, "name": "Olive Owner", "user_type": "individual"}
    )
    assert registered.status_code == 201, registered.text

    context = browser.new_context(viewport=LAPTOP, base_url=base)
    page = context.new_page()
    page_errors: list[str] = []
    page.on("pageerror", lambda exc: page_errors.append(str(exc)))
    page.goto(f"{base}/console/signin")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("API keys", timeout=WAIT_MS)

    # ---- list: the owner alone ---------------------------------------------------------------
    page.get_by_role("link", name="Members").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Members", timeout=WAIT_MS)
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
    dev_session = {"Authorization": f"Bearer {dev_login.json()['access_token']}"}
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
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1, f"members scrolls sideways by {overflow}px at phone width"
    assert page_errors == [], page_errors
    context.close()
