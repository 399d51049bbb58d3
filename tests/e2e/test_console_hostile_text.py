"""Stored XSS, in a real browser against a real `tollgate serve`: every text a user, a caller or a
platform service chooses (a key's name, a member's name, a caller's User-Agent, a reported model
and provider, a GEO project's name) reaches the console as markup-looking text, and each page shows
it as the text it is: no element is made of it and no script of it runs."""

import uuid
from datetime import UTC, datetime

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from services.runtime.platform.settings import Settings
from tests.e2e.console import (
    PASSWORD,
    WAIT_MS,
    bearer,
    create_key,
    open_console,
    open_page,
    register,
    service_token,
    sign_in,
)
from tests.support.apps import ServeProcess


def payload(where: str) -> str:
    """Markup that, were it parsed, would add an element with a known id and run a script."""
    return f"<img id=xss-{where} src=x onerror=window.__xss=1><script>window.__xss=2</script>"


def shows_as_text(page: Page, where: str) -> None:
    expect(page.get_by_text(payload(where)).first).to_be_visible(timeout=WAIT_MS)
    assert page.locator(f"#xss-{where}").count() == 0, f"{where} became markup"
    assert page.evaluate("window.__xss") is None, f"{where} ran a script"


@pytest.mark.integration
def test_text_from_users_callers_and_services_is_shown_as_text(
    server: ServeProcess, api: httpx.Client, browser: Browser, settings: Settings
) -> None:
    base = server.base_url
    owner = register(api, "hostile", "Owner")
    key = create_key(api, owner.console, payload("key-name"))
    member = {"email": f"m-{uuid.uuid4().hex[:8]}@example.com", "name": payload("member"), "password": PASSWORD, "role": "viewer"}
    assert api.post("/api/account/members", json=member, headers=owner.console).status_code == 201
    called = api.get("/api/geo/projects", headers={**bearer(key["key"]), "User-Agent": payload("agent")})
    assert called.status_code == 200, called.text
    service = bearer(service_token(api, settings, "hostile-text"))
    event = {
        "id": str(uuid.uuid4()), "time": datetime.now(UTC).isoformat(), "account_id": str(owner.account_id),
        "resource": "ai_tokens", "quantity": 30, "input_tokens": 10, "output_tokens": 20,
        "provider": payload("p")[:64], "model": payload("model"), "source": "gateway",
    }  # fmt: skip
    assert api.post("/api/usage/events", json={"events": [event]}, headers=service).status_code == 202

    page, page_errors = open_console(browser, base)
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    sign_in(page, base, owner.email)
    shows_as_text(page, "key-name")
    open_page(page, base, "members", "Members")
    shows_as_text(page, "member")
    open_page(page, base, "usage", "Usage")
    shows_as_text(page, "agent")  # the activity log
    expect(page.get_by_role("cell", name=payload("model"), exact=True)).to_be_visible(timeout=WAIT_MS)  # by provider
    assert page.locator("[id^=xss-]").count() == 0 and page.evaluate("window.__xss") is None
    open_page(page, base, "audit", "Audit log")
    shows_as_text(page, "key-name")  # api_key.created's details name it
    assert dialogs == [] and page_errors == [], (dialogs, page_errors)
    page.context.close()
