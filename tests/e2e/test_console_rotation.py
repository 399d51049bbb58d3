"""(v2) The rotation reminder in a real browser against a real `tollgate serve`: a key older than
90 days shows up in the notifications as "Rotate this key", with a link that opens the keys page
on that key, where it is flagged "Rotation due"; a key that expires shows a countdown. A key
rotated with a grace period is flagged "Replaced" and offers no second rotation (the API would
answer 409): its successor does. The key's
age comes from keys.v1 for alerts (its state republished here with a creation time 91 days back,
as a key made then would carry) and from the keys service's own row for the list (set back as
well). Screenshots go to artifacts/screenshots/."""

import re
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
    bearer,
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


@pytest.mark.integration
def test_a_rotated_key_in_its_grace_period_offers_no_second_rotation(
    server: ServeProcess, api: httpx.Client, browser: Browser
) -> None:
    base = server.base_url
    ines = register(api, "ines", "Ines")
    key = create_key(api, ines.console, "billing job")
    page, page_errors = open_console(browser, base, LAPTOP)
    sign_in(page, base, ines.email)
    open_page(page, base, "keys", "API keys")
    page.get_by_role("button", name="Rotate key billing job").first.click()
    dialog = page.get_by_role("dialog", name="Rotate key “billing job”")
    dialog.get_by_label("Grace period for the old key").select_option("3600")
    dialog.get_by_role("button", name="Rotate key").click()
    new_secret = page.get_by_label("Full API key for billing job").input_value()
    page.get_by_role("button", name="I have stored it").click()

    rows = page.locator("#keys-table tbody tr", has_text="billing job")
    expect(rows).to_have_count(2)
    old_row = page.locator(f'#keys-table tr[data-key-id="{key["id"]}"]')
    expect(old_row.locator(".status-replaced")).to_have_text("Replaced")
    expect(old_row.locator(".countdown")).to_have_text(re.compile(r"^\(in (59|60) minutes\)$"))  # its grace
    expect(old_row.get_by_role("button", name="Rotate key billing job")).to_be_hidden()  # rotated once: 409 again
    new_row = rows.filter(has_not=page.locator(".status-replaced"))
    expect(new_row.get_by_role("button", name="Rotate key billing job")).to_be_visible()  # the successor is rotated
    expect(new_row.locator(".status-replaced")).to_have_count(0)
    shot(page, "keys-rotated-in-grace")
    again = api.post(f"/api/api-keys/{key['id']}/rotate", json={"grace_seconds": 0}, headers=ines.console)
    assert (again.status_code, again.json()["error"]["code"]) == (409, "conflict")
    assert api.get("/api/geo/projects", headers=bearer(new_secret)).status_code == 200
    assert page_errors == []
    page.context.close()
