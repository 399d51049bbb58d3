"""(v2) The rotation reminder in a real browser against a real `tollgate serve`: a key older than
90 days shows up in the notifications as "Rotate this key", with a link that opens the keys page
on that key, where it is flagged "Rotation due"; a key that expires shows a countdown. The key's
age comes from keys.v1 for alerts (its state republished here with a creation time 91 days back,
as a key made then would carry) and from the keys service's own row for the list (set back as
well). Screenshots go to artifacts/screenshots/."""

import uuid
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
import pytest
from playwright.sync_api import Browser, expect

from contracts.common import KeyStatus, Role
from contracts.credentials import hash_secret
from contracts.events import KeyState
from contracts.topics import KEYS
from services.runtime.platform.settings import Settings
from tests.e2e.console import (
    LAPTOP,
    PHONE,
    create_key,
    expect_page,
    open_console,
    open_page,
    poll_clicking,
    register,
    run_beside,
    shot,
    sign_in,
)
from tests.integration.quota_helpers import publish
from tests.support.apps import ServeProcess


@pytest.mark.integration
def test_the_reminder_to_rotate_an_old_key_links_to_the_key(
    server: ServeProcess, api: httpx.Client, browser: Browser, settings: Settings
) -> None:
    base = server.base_url
    grace = register(api, "grace", "Grace")
    key = create_key(api, grace.console, "legacy server")

    # The key as keys.v1 carries it, made 91 days ago.
    now = datetime.now(UTC)
    state = KeyState(
        time=now,
        account_id=grace.account_id,
        key_id=uuid.UUID(key["id"]),
        hash=hash_secret(key["key"]),
        status=KeyStatus.ENABLED,
        roles=[Role(r) for r in grace.account["roles"]],
        masked_key=key["masked_key"],
        created_at=now - timedelta(days=91),
    )
    run_beside(publish(settings, KEYS.name, [state], key=lambda e: str(e.key_id)))
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute("UPDATE keys.api_keys SET created_at = %s WHERE id = %s", (state.created_at, state.key_id))
    expiring = create_key(api, grace.console, "trial", expires_at=(now + timedelta(days=3, hours=1)).isoformat())

    for viewport in (LAPTOP, PHONE):
        page, page_errors = open_console(browser, base, viewport)
        sign_in(page, base, grace.email)
        open_page(page, base, "alerts", "Alerts")
        reminder = page.locator('#notifications .notification[data-kind="key_rotation_due"]')
        refresh = page.get_by_role("button", name="Refresh")
        poll_clicking(refresh, lambda: reminder.count() > 0, "the rotation reminder", timeout=30)
        expect(reminder).to_have_count(1)
        expect(reminder).to_contain_text("Rotate this key")
        expect(reminder).to_contain_text(key["masked_key"])
        expect(reminder).to_contain_text("API key older than 90 days")
        link = reminder.get_by_role("link", name="Open the key")
        expect(link).to_have_attribute("href", f"/console/keys?key={key['id']}")
        reminder.scroll_into_view_if_needed()
        shot(page, "alerts-rotation")
        link.click()
        expect_page(page, "API keys")
        old_row = page.locator(f'#keys-table tr[data-key-id="{key["id"]}"]')
        expect(old_row).to_contain_text("legacy server")
        expect(old_row.locator(".status-rotation")).to_have_text("Rotation due")
        trial_row = page.locator(f'#keys-table tr[data-key-id="{expiring["id"]}"]')
        expect(trial_row.locator(".countdown")).to_have_text("(in 3 days)")
        expect(trial_row.locator(".status-rotation")).to_have_count(0)
        shot(page, "keys-rotation-due")
        assert page_errors == []
        page.context.close()
