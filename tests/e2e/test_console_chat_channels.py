"""(v4) Slack and Microsoft Teams alert rules in a real browser against a real `tollgate serve`:
the alerts page offers both with the URL field, shows no signing secret for them, explains the
one-URL-channel rule, and a firing reaches a local Slack receiver (which checks Slack's message
shape) and shows in the rule's Deliveries view. The server allows one outside message a day
(ALERTS_OUTSIDE_MESSAGES_PER_DAY=1): the Teams rule, firing next, is held back, and its Deliveries
view says why. Screenshots go to artifacts/screenshots/."""

import uuid
from datetime import UTC, datetime

import httpx
import pytest
from playwright.sync_api import Browser, expect

from contracts.common import Resource
from contracts.events import QuotaThresholdCrossed
from contracts.period import period_of
from contracts.topics import QUOTA_THRESHOLDS
from services.runtime.platform.settings import Settings
from tests.e2e.console import WAIT_MS, open_console, open_page, poll, register, run_beside, shot, sign_in
from tests.integration.quota_helpers import publish
from tests.support.apps import ServeProcess
from tests.support.chat_receivers import serving, slack_receiver, teams_receiver


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The server's: one outside alert message a day per account (docs/alerts.md)."""
    return settings.model_copy(update={"alerts_outside_messages_per_day": 1})


def crossing(account_id: uuid.UUID, settings: Settings, pct: int) -> QuotaThresholdCrossed:
    """quota-thresholds.v1's crossing of `pct`% of the account's AI tokens this period."""
    now = datetime.now(UTC)
    return QuotaThresholdCrossed(
        time=now,
        account_id=account_id,
        resource=Resource.AI_TOKENS,
        period=period_of(now, settings.tz),
        threshold_pct=pct,
        used=pct * 10,
        total=1000,
    )


@pytest.mark.integration
def test_slack_and_teams_rules_are_made_in_the_console_and_their_deliveries_are_logged(
    server: ServeProcess, api: httpx.Client, browser: Browser, settings: Settings
) -> None:
    base = server.base_url
    user = register(api, "chat", "Chat")

    with serving(slack_receiver()) as slack, serving(teams_receiver()) as teams:
        page, page_errors = open_console(browser, base)
        sign_in(page, base, user.email)
        open_page(page, base, "alerts", "Alerts")

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
        # The URL is the channel's credential: shown masked, as a key is, never whole.
        expect(teams_rule).to_contain_text(f"{teams.url().rsplit('/services/', 1)[0]}/...{teams.url()[-4:]}")
        expect(teams_rule).not_to_contain_text(teams.url())
        page.get_by_role("checkbox", name="Microsoft Teams").uncheck()
        page.get_by_role("checkbox", name="Slack").check()
        page.get_by_label("Threshold (% of quota)").fill("50")
        page.get_by_label("Webhook URL").fill(slack.url())
        page.get_by_role("button", name="Add rule").click()
        slack_rule = page.locator("#rules-table tbody tr", has_text="Slack")
        expect(slack_rule).to_contain_text("50%", timeout=WAIT_MS)
        expect(page.get_by_role("textbox", name="Webhook signing secret")).to_have_count(0)

        # 60% of the tokens: the Slack rule fires (not the 80% Teams one).
        run_beside(
            publish(settings, QUOTA_THRESHOLDS.name, [crossing(user.account_id, settings, 60)], key=lambda e: str(e.account_id))
        )
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

        # 85%: the Teams rule fires, past the day's one outside message: held back, never posted.
        run_beside(
            publish(settings, QUOTA_THRESHOLDS.name, [crossing(user.account_id, settings, 85)], key=lambda e: str(e.account_id))
        )
        (teams_id,) = [
            r["id"] for r in api.get("/api/ai/usage/alert", headers=user.console).json()["rules"] if r["threshold_pct"] == 80
        ]
        poll(
            lambda: api.get(f"/api/ai/usage/alert/{teams_id}/deliveries", headers=user.console).json()["items"],
            "the held-back delivery",
        )
        teams_rule.get_by_role("button", name="Deliveries of the Total tokens 80% rule").click()
        expect(page.locator("#deliveries-title")).to_have_text("Deliveries: Total tokens at 80%", timeout=WAIT_MS)
        expect(log).to_have_count(1)
        expect(log.first).to_have_attribute("data-status", "failed")
        expect(log.first).to_contain_text("Microsoft Teams")
        error = log.first.locator('td[data-label="Error"]')
        expect(error).to_contain_text("not sent: the account's daily limit of 1 outside alert messages")
        expect(error).to_contain_text("in-site notifications still arrive")
        expect(log.first.locator('td[data-label="Attempt"]')).to_have_text("0")
        shot(page, "alerts-held-back-deliveries")
        assert teams.received() == []
        assert page_errors == []
        page.context.close()
