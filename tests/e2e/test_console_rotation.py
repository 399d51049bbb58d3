"""(v2) The rotation reminder in a real browser against a real `tollgate serve`: a key older than
90 days shows up in the notifications as "Rotate this key", with a link that opens the keys page
on that key, where it is flagged "Rotation due"; a key that expires shows a countdown. The key's
age comes from keys.v1 for alerts (its state republished here with a creation time 91 days back,
as a key made then would carry) and from the keys service's own row for the list (set back as
well). Screenshots go to artifacts/screenshots/."""

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
import pytest
from playwright.sync_api import Browser, expect

from contracts.common import KeyStatus, Role
from contracts.credentials import hash_secret
from contracts.events import KeyState
from contracts.topics import KEYS
from tests.e2e.test_console import LAPTOP, PHONE, WAIT_MS, browser, poll, server, shot  # noqa: F401 (fixtures)
from tests.integration.quota_helpers import publish
from tests.support.apps import ServeProcess

PASSWORD = "correct horse battery"


@pytest.mark.integration
def test_the_reminder_to_rotate_an_old_key_links_to_the_key(server: ServeProcess, browser: Browser, settings) -> None:  # noqa: F811
    base = server.base_url
    api = httpx.Client(base_url=base, timeout=10)
    email = f"grace-{uuid.uuid4().hex[:8]}@example.com"
    registered = api.post(
        "/api/auth/register", json={"email": email, "password": PASSWORD, "name": "Grace", "user_type": "individual"}
    )
    assert registered.status_code == 201, registered.text
    login = api.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    console = {"Authorization": f"Bearer {login.json()['access_token']}"}
    made = api.post("/api/api-keys", json={"name": "legacy server"}, headers=console)
    assert made.status_code == 201, made.text
    key = made.json()

    # The key as keys.v1 carries it, made 91 days ago.
    now = datetime.now(UTC)
    state = KeyState(
        time=now,
        account_id=uuid.UUID(registered.json()["id"]),
        key_id=uuid.UUID(key["id"]),
        hash=hash_secret(key["key"]),
        status=KeyStatus.ENABLED,
        roles=[Role(r) for r in registered.json()["roles"]],
        masked_key=key["masked_key"],
        created_at=now - timedelta(days=91),
    )
    with ThreadPoolExecutor(1) as thread:  # the test's own event loop is running: publish beside it
        thread.submit(asyncio.run, publish(settings, KEYS.name, [state], key=lambda e: str(e.key_id))).result()
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute("UPDATE keys.api_keys SET created_at = %s WHERE id = %s", (state.created_at, state.key_id))
    expiring = api.post(
        "/api/api-keys", json={"name": "trial", "expires_at": (now + timedelta(days=3, hours=1)).isoformat()}, headers=console
    )
    assert expiring.status_code == 201, expiring.text

    for viewport in (LAPTOP, PHONE):
        context = browser.new_context(viewport=viewport, base_url=base)
        page = context.new_page()
        page_errors: list[str] = []
        page.on("pageerror", lambda exc: page_errors.append(str(exc)))
        page.goto(f"{base}/console")
        expect(page.get_by_role("heading", name="Sign in")).to_be_visible(timeout=WAIT_MS)
        page.get_by_label("Email").fill(email)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", level=1)).to_have_text("API keys", timeout=WAIT_MS)
        page.goto(f"{base}/console/alerts")
        expect(page.get_by_role("heading", level=1)).to_have_text("Alerts", timeout=WAIT_MS)
        reminder = page.locator('#notifications .notification[data-kind="key_rotation_due"]')
        refresh = page.get_by_role("button", name="Refresh")

        def reminded() -> bool:
            refresh.click()
            page.wait_for_timeout(150)
            return reminder.count() > 0

        poll(reminded, "the rotation reminder", timeout=30)
        expect(reminder).to_have_count(1)
        expect(reminder).to_contain_text("Rotate this key")
        expect(reminder).to_contain_text(key["masked_key"])
        expect(reminder).to_contain_text("API key older than 90 days")
        link = reminder.get_by_role("link", name="Open the key")
        expect(link).to_have_attribute("href", f"/console/keys?key={key['id']}")
        reminder.scroll_into_view_if_needed()
        shot(page, "alerts-rotation")
        link.click()
        expect(page.get_by_role("heading", level=1)).to_have_text("API keys", timeout=WAIT_MS)
        old_row = page.locator(f'#keys-table tr[data-key-id="{key["id"]}"]')
        expect(old_row).to_contain_text("legacy server")
        expect(old_row.locator(".status-rotation")).to_have_text("Rotation due")
        trial_row = page.locator(f'#keys-table tr[data-key-id="{expiring.json()["id"]}"]')
        expect(trial_row.locator(".countdown")).to_have_text("(in 3 days)")
        expect(trial_row.locator(".status-rotation")).to_have_count(0)
        shot(page, "keys-rotation-due")
        assert page_errors == []
        context.close()
