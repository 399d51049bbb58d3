"""(v4) A key's own rules in the console, in a real browser (Chromium through Playwright) against a
real `tollgate serve`: an owner opens a key, narrows it to one model, one route prefix, the office's
addresses, a rate limit and a monthly token limit, sees a bad value refused with the field named
(422), then clears a rule; the API answers what the page shows. Screenshots go to artifacts/screenshots/."""

import httpx
import pytest
from playwright.sync_api import Browser, expect

from tests.e2e.console import WAIT_MS, create_key, open_console, register, shot, sign_in
from tests.support.apps import ServeProcess


@pytest.mark.integration
def test_an_owner_narrows_a_key_in_the_browser(server: ServeProcess, api: httpx.Client, browser: Browser) -> None:
    base = server.base_url
    owner = register(api, "owner", "Olive Owner")
    console = owner.console
    key = create_key(api, console, "ci")
    page, page_errors = open_console(browser, base)
    sign_in(page, base, owner.email)

    # ---- open the key and narrow it ------------------------------------------------------------
    page.get_by_role("button", name="Rules of key ci").click()
    view = page.locator("#key-view")
    expect(view.get_by_role("heading", name="Key “ci”")).to_be_visible(timeout=WAIT_MS)
    view.get_by_label("Allowed models").fill("openai/gpt-4o-mini")
    view.get_by_label("Allowed routes").fill("POST /v1/chat/*")
    view.get_by_label("Allowed addresses").fill("198.51.100.0/24\n2001:db8::/32")
    view.get_by_label("Requests per second").fill("1")
    view.get_by_label("Burst").fill("2")
    view.get_by_label("Requests per minute").fill("60")
    view.get_by_role("button", name="Add limit").click()
    limit = view.locator(".key-limit").first
    limit.get_by_label("Resource").select_option("ai_tokens")
    limit.get_by_label("Amount").fill("50000")
    limit.get_by_label("Period").select_option("month")

    # ---- a bad value: the 422's field and message are shown, nothing is saved --------------------
    view.get_by_label("Allowed routes").fill("POST /v1/*/chat")
    view.get_by_role("button", name="Save rules").click()
    error = view.locator("#key-rules-errors [role=alert]")
    expect(error).to_contain_text("allowed_routes", timeout=WAIT_MS)
    expect(error).to_contain_text("may only end a route pattern")
    shot(page, "key-rules-error")
    assert api.get("/api/api-keys", headers=console).json()["items"][0]["allowed_models"] == []

    view.get_by_label("Allowed routes").fill("POST /v1/chat/*")
    view.get_by_role("button", name="Save rules").click()
    expect(page.locator("#key-view #key-rules-errors [role=alert]")).to_have_count(0, timeout=WAIT_MS)
    expect(page.get_by_text("Rules of key “ci” saved.")).to_be_visible(timeout=WAIT_MS)
    shot(page, "key-rules")
    [saved] = api.get("/api/api-keys", headers=console).json()["items"]
    assert saved["id"] == key["id"]
    assert saved["allowed_models"] == ["openai/gpt-4o-mini"] and saved["allowed_routes"] == ["POST /v1/chat/*"]
    assert saved["allowed_ips"] == ["198.51.100.0/24", "2001:db8::/32"]
    assert saved["rate_limit"] == {"per_second": 1.0, "burst": 2, "per_minute": 60}
    assert saved["limits"] == [{"resource": "ai_tokens", "amount": 50000, "period": "month"}]

    # ---- the reopened view shows what was saved; clearing a rule sends null ----------------------
    view = page.locator("#key-view")
    expect(view.get_by_label("Allowed addresses")).to_have_value("198.51.100.0/24\n2001:db8::/32", timeout=WAIT_MS)
    view.get_by_label("Allowed addresses").fill("")
    view.get_by_label("Requests per second").fill("")
    view.get_by_label("Burst").fill("")
    view.get_by_label("Requests per minute").fill("")
    view.get_by_role("button", name="Save rules").click()

    def cleared() -> bool:
        [item] = api.get("/api/api-keys", headers=console).json()["items"]
        return item["allowed_ips"] == [] and item["rate_limit"] is None and item["allowed_models"] == ["openai/gpt-4o-mini"]

    expect(view.get_by_label("Allowed addresses")).to_have_value("", timeout=WAIT_MS)
    page.wait_for_timeout(300)
    assert cleared()
    view.get_by_role("button", name="Close").click()
    expect(page.locator("#key-view")).to_have_count(0)
    assert page_errors == []
    page.context.close()
