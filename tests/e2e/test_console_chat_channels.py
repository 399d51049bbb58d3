"""(v4) Slack and Microsoft Teams alert rules in a real browser against a real `tollgate serve`:
the alerts page offers both with the URL field, shows no signing secret for them, explains the
one-URL-channel rule, and a firing reaches a local Slack receiver (which checks Slack's message
shape) and shows in the rule's Deliveries view. Screenshots go to artifacts/screenshots/."""

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


@pytest.mark.integration
def test_slack_and_teams_rules_are_made_in_the_console_and_a_slack_delivery_is_logged(
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
        crossing = QuotaThresholdCrossed(
            time=datetime.now(UTC),
            account_id=user.account_id,
            resource=Resource.AI_TOKENS,
            period=period_of(datetime.now(UTC), settings.tz),
            threshold_pct=60,
            used=600,
            total=1000,
        )
        run_beside(publish(settings, QUOTA_THRESHOLDS.name, [crossing], key=lambda e: str(e.account_id)))
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
        page.context.close()
