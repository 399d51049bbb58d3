"""(v4) Slack and Microsoft Teams alert rules in a real browser against a real `tollgate serve`:
the alerts page offers both with the URL field, shows no signing secret for them, explains the
one-URL-channel rule, and a firing reaches a local Slack receiver (which checks Slack's message
shape) and shows in the rule's Deliveries view. Screenshots go to artifacts/screenshots/."""

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import httpx
import pytest
from playwright.sync_api import Browser, expect

from contracts.common import Resource
from contracts.events import QuotaThresholdCrossed
from contracts.period import period_of
from contracts.topics import QUOTA_THRESHOLDS
from tests.e2e.test_console import LAPTOP, WAIT_MS, browser, poll, server, shot  # noqa: F401 (fixtures)
from tests.integration.quota_helpers import publish
from tests.support.apps import ServeProcess
from tests.support.chat_receivers import serving, slack_receiver, teams_receiver

PASSWORD = "correct horse battery"


@pytest.mark.integration
def test_slack_and_teams_rules_are_made_in_the_console_and_a_slack_delivery_is_logged(
    server: ServeProcess,  # noqa: F811
    browser: Browser,  # noqa: F811
    settings,
) -> None:
    base = server.base_url
    api = httpx.Client(base_url=base, timeout=10)
    email = f"chat-{uuid.uuid4().hex[:8]}@example.com"
    registered = api.post(
        "/api/auth/register", json={"email": email, "password": PASSWORD, "name": "Chat", "user_type": "individual"}
    )
    assert registered.status_code == 201, registered.text
    account_id = uuid.UUID(registered.json()["id"])

    with serving(slack_receiver()) as slack, serving(teams_receiver()) as teams:
        context = browser.new_context(viewport=LAPTOP, base_url=base)
        page = context.new_page()
        page_errors: list[str] = []
        page.on("pageerror", lambda exc: page_errors.append(str(exc)))
        page.goto(f"{base}/console")
        page.get_by_label("Email").fill(email)
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", level=1)).to_have_text("API keys", timeout=WAIT_MS)
        page.goto(f"{base}/console/alerts")
        expect(page.get_by_role("heading", level=1)).to_have_text("Alerts", timeout=WAIT_MS)

        # Both at once: the server's 422 says a rule names one URL channel.
        page.get_by_label("Threshold (% of quota)").fill("80")
        page.get_by_role("checkbox", name="In-site").uncheck()
        page.get_by_role("checkbox", name="Slack").check()
        page.get_by_role("checkbox", name="Microsoft Teams").check()
        page.get_by_label("Webhook URL").fill(slack.url())
        page.get_by_role("button", name="Add rule").click()
        expect(page.get_by_role("alert").filter(has_text="only one of webhook, slack, teams")).to_be_visible(timeout=WAIT_MS)

        # A Teams rule, then a Slack rule: no signing secret is shown for either.
        page.get_by_role("checkbox", name="Slack").uncheck()
        page.get_by_label("Webhook URL").fill(teams.url())
        page.get_by_role("button", name="Add rule").click()
        teams_rule = page.locator("#rules-table tbody tr", has_text="Microsoft Teams")
        expect(teams_rule).to_contain_text("80%", timeout=WAIT_MS)
        expect(teams_rule).to_contain_text(teams.url())
        page.get_by_role("checkbox", name="Microsoft Teams").uncheck()
        page.get_by_role("checkbox", name="Slack").check()
        page.get_by_label("Threshold (% of quota)").fill("50")
        page.get_by_label("Webhook URL").fill(slack.url())
        page.get_by_role("button", name="Add rule").click()
        slack_rule = page.locator("#rules-table tbody tr", has_text="Slack")
        expect(slack_rule).to_contain_text("50%", timeout=WAIT_MS)
        expect(page.get_by_role("textbox", name="Webhook signing secret")).to_have_count(0)

        # 60% of the tokens: the Slack rule fires (not the 80% Teams one).
        crossing = QuotaThresholdCrossed(
            time=datetime.now(UTC),
            account_id=account_id,
            resource=Resource.AI_TOKENS,
            period=period_of(datetime.now(UTC), settings.tz),
            threshold_pct=60,
            used=600,
            total=1000,
        )
        with ThreadPoolExecutor(1) as thread:  # the test's own event loop is running: publish beside it
            thread.submit(
                asyncio.run, publish(settings, QUOTA_THRESHOLDS.name, [crossing], key=lambda e: str(e.account_id))
            ).result()
        poll(lambda: slack.received(), "the Slack delivery", timeout=30)
        (request,) = slack.received()
        assert (request["answered"], request["problem"]) == (200, None), request
        assert teams.received() == []

        slack_rule.get_by_role("button", name="Deliveries of the Total tokens 50% rule").click()
        log = page.locator("#deliveries-table tbody tr")
        expect(log).to_have_count(1, timeout=WAIT_MS)
        expect(log.first).to_contain_text("Slack")
        expect(log.first).to_contain_text("200")
        expect(log.first).to_contain_text("sent")
        shot(page, "alerts-slack-deliveries")
        assert page_errors == []
        context.close()
