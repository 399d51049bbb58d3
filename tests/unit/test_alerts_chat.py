"""The slack and teams channels (v4) without I/O: each platform's message shape, Slack's mrkdwn
escaping, the https-only rule, and which rules may name them."""

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import pytest
from pydantic import ValidationError

from contracts.alerts_api import Channel, EmailRecipient, RuleIn, WebhookRecipient
from contracts.common import AlertMetric, Resource
from services.alerts import chat, domain, targets, webhook
from tests.support.chat_receivers import check_slack_shape, check_teams_shape

ACCOUNT = uuid.UUID("00000000-0000-0000-0000-0000000000aa")
DELIVERY = uuid.UUID("11111111-2222-3333-4444-555555555555")
LINKS = domain.links_for("https://console.example", Resource.AI_TOKENS)
MESSAGE = domain.AlertMessage(AlertMetric.TOTAL_TOKENS, 80, 95_000, 100_000, "2026-11", LINKS)
HOOK = WebhookRecipient(url="https://hooks.slack.com/services/T0/B0/abc")


def test_the_slack_message_has_a_fallback_text_and_blocks_with_the_facts_and_links():
    body = chat.slack_message(MESSAGE, DELIVERY)
    check_slack_shape(body)
    json.dumps(body)  # plain JSON
    header, facts, links, context = body["blocks"]
    assert header["text"]["text"] == MESSAGE.title
    for text in (body["text"], facts["text"]["text"]):
        assert "total_tokens" in text and "80%" in text and "95,000" in text and "100,000" in text and "2026-11" in text
    assert "95.00%" in facts["text"]["text"]
    assert "<https://console.example/plan|Upgrade your plan>" in links["text"]["text"]
    assert "<https://console.example/quota?buy=ai_tokens|Buy a quota package>" in links["text"]["text"]
    assert "<https://console.example/plan|Upgrade your plan>" in body["text"]
    assert str(DELIVERY) in context["elements"][0]["text"]


def test_slack_control_characters_are_escaped_in_every_mrkdwn_text():
    hostile = domain.AlertMessage(
        AlertMetric.API_CALLS, 90, 1, 2, "<!channel>&", domain.Links("https://x.example/?a=1&b=<2>", "https://y|z")
    )
    body = chat.slack_message(hostile, DELIVERY)
    assert "<!channel>" not in json.dumps(body)  # no mention of everyone, no link Slack would parse
    for text in (body["text"], body["blocks"][1]["text"]["text"]):
        assert "&lt;!channel&gt;&amp;" in text
    assert "<https://x.example/?a=1&amp;b=&lt;2&gt;|Upgrade your plan>" in body["blocks"][2]["text"]["text"]
    assert chat.slack_escape("a & b < c > d") == "a &amp; b &lt; c &gt; d"


def test_the_teams_message_is_one_adaptive_card_with_facts_and_open_url_actions():
    body = chat.teams_message(MESSAGE, DELIVERY)
    check_teams_shape(body)
    card = body["attachments"][0]["content"]
    title, summary, facts, footer = card["body"]
    assert title["text"] == MESSAGE.title and title["weight"] == "Bolder"
    assert summary["text"] == MESSAGE.summary()
    assert {f["title"]: f["value"] for f in facts["facts"]} == {
        "Metric": "total_tokens",
        "Threshold": "80%",
        "Usage": "95,000 (95.00%)",
        "Limit": "100,000",
        "Period": "2026-11",
    }
    assert str(DELIVERY) in footer["text"]
    assert [(a["title"], a["url"]) for a in card["actions"]] == [
        ("Upgrade your plan", "https://console.example/plan"),
        ("Buy a quota package", "https://console.example/quota?buy=ai_tokens"),
    ]


def test_the_shape_checks_catch_what_the_platforms_refuse():
    with pytest.raises(AssertionError):
        check_slack_shape({"blocks": chat.slack_message(MESSAGE, DELIVERY)["blocks"]})  # no fallback text
    with pytest.raises(AssertionError):
        check_slack_shape({"text": "x", "blocks": [{"type": "header", "text": {"type": "mrkdwn", "text": "x"}}]})
    with pytest.raises(AssertionError):
        check_teams_shape(json.loads(webhook.payload(DELIVERY, DELIVERY, ACCOUNT, datetime.now(UTC), MESSAGE)))


def test_chat_message_picks_the_platform():
    assert chat.chat_message(Channel.SLACK, MESSAGE, DELIVERY) == chat.slack_message(MESSAGE, DELIVERY)
    assert chat.chat_message(Channel.TEAMS, MESSAGE, DELIVERY) == chat.teams_message(MESSAGE, DELIVERY)
    with pytest.raises(ValueError):
        chat.chat_message(Channel.EMAIL, MESSAGE, DELIVERY)


# ---- which rules may name slack and teams --------------------------------------------------------
@pytest.mark.parametrize("channel", [Channel.SLACK, Channel.TEAMS])
def test_a_chat_channel_takes_url_recipients(channel):
    assert domain.validate_rule([channel], [HOOK]) == []
    assert domain.validate_rule([channel, Channel.IN_SITE], [HOOK]) == []
    planned = domain.plan_deliveries(ACCOUNT, [channel], [HOOK])
    assert planned == [domain.PlannedDelivery(channel, f"url:{HOOK.url}")]


@pytest.mark.parametrize(
    ("channels", "recipients", "fields"),
    [
        ([Channel.SLACK], [], ["recipients"]),  # no URL
        ([Channel.SLACK], [EmailRecipient(email="ops@example.com")], ["channels", "recipients"]),  # an {email} for slack
        ([Channel.TEAMS], [WebhookRecipient(url="not a url")], ["recipients.0.url"]),
        ([Channel.TEAMS], [WebhookRecipient(url="ftp://teams.example/x")], ["recipients.0.url"]),
        ([Channel.SLACK, Channel.TEAMS], [HOOK], ["channels"]),  # one URL channel per rule
        ([Channel.WEBHOOK, Channel.SLACK], [HOOK], ["channels"]),
        ([Channel.IN_SITE], [HOOK], ["channels"]),  # a {url} without a URL channel
    ],
)
def test_misfits_name_the_field(channels, recipients, fields):
    problems = domain.validate_rule(channels, recipients)
    assert [p.field for p in problems] == fields, problems


def test_the_messages_say_which_channels_fit():
    (problem,) = domain.validate_rule([Channel.IN_SITE], [HOOK])
    assert problem.message == "A {url} recipient needs the webhook or slack or teams channel."
    (problem,) = domain.validate_rule([Channel.SLACK, Channel.TEAMS], [HOOK])
    assert "only one of webhook, slack, teams" in problem.message


def test_the_schema_takes_slack_and_teams_and_every_channel_at_once():
    body = {"metric": "api_calls", "threshold_pct": 50, "channels": ["slack"], "recipients": [{"url": HOOK.url}]}
    assert RuleIn.model_validate(body).channels == [Channel.SLACK]
    every = {**body, "channels": [c.value for c in Channel]}  # schema-valid; validate_rule says what misfits
    assert len(RuleIn.model_validate(every).channels) == len(Channel)
    with pytest.raises(ValidationError):
        RuleIn.model_validate({**body, "channels": ["discord"]})


# ---- https only --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "https_only", "allow_private", "refused"),
    [
        ("http://hooks.example.com/x", True, False, True),
        ("https://hooks.example.com/x", True, False, False),
        ("http://hooks.example.com/x", False, False, False),  # the webhook channel takes http
        ("http://127.0.0.1:8080/x", True, True, False),  # local test receivers, as the operator allows
    ],
)
def test_chat_urls_are_https_unless_private_targets_are_allowed(url, https_only, allow_private, refused):
    reason = webhook.scheme_refusal(targets.parse_target(url), https_only, allow_private)
    assert (reason is not None) == refused
    if refused:
        assert reason == "the URL must be https"


async def test_creation_refuses_plain_http_for_chat_channels_before_resolving():
    assert await webhook.creation_refusal("http://no-such-host.invalid/x", allow_private=False, https_only=True) == (
        "the URL must be https"
    )
    assert await webhook.creation_refusal("https://no-such-host.invalid/x", allow_private=False, https_only=True) is None
    assert await webhook.creation_refusal("http://127.0.0.1:9/x", allow_private=True, https_only=True) is None


# ---- the post itself: unsigned, and Slack's "ok" -----------------------------------------------
def _sender(status: int, answer: str, seen: list[httpx.Request], allow_private: bool = True) -> webhook.WebhookSender:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)

        async def streamed() -> AsyncIterator[bytes]:  # as a server's answer arrives (the sender reads its head raw)
            yield answer.encode()

        return httpx.Response(status, content=streamed())

    return webhook.WebhookSender(allow_private, client=httpx.AsyncClient(transport=httpx.MockTransport(handle)))


def _request(url: str = "http://127.0.0.1:9/hook", ok_body: str | None = chat.SLACK_OK_BODY) -> webhook.WebhookRequest:
    return webhook.WebhookRequest(url, None, DELIVERY, 1, b"{}", https_only=True, ok_body=ok_body)


@pytest.mark.parametrize(
    ("status", "answer", "ok_body", "error"),
    [
        (200, "ok", chat.SLACK_OK_BODY, None),
        (200, "invalid_payload", chat.SLACK_OK_BODY, "receiver answered 200: invalid_payload"),
        (400, "invalid_payload", chat.SLACK_OK_BODY, "receiver answered 400: invalid_payload"),
        (202, "", None, None),  # Teams: any 2xx
        (500, "", None, "receiver answered 500"),
    ],
)
async def test_a_chat_post_is_unsigned_and_succeeds_as_the_platform_says(status, answer, ok_body, error):
    seen: list[httpx.Request] = []
    sender = _sender(status, answer, seen)
    result = await sender.attempt(_request(ok_body=ok_body), datetime.now(UTC))
    await sender.close()
    assert (result.status_code, result.error) == (status, error)
    (request,) = seen
    assert webhook.SIGNATURE_HEADER.lower() not in {k.lower() for k in request.headers}
    assert request.headers["content-type"] == "application/json"


async def test_plain_http_is_refused_at_delivery_without_the_operator_setting():
    seen: list[httpx.Request] = []
    strict = _sender(200, "ok", seen, allow_private=False)
    result = await strict.attempt(_request("http://hooks.example.com/x"), datetime.now(UTC))
    await strict.close()
    assert result.status_code is None and result.error == "target refused: the URL must be https"
    assert seen == []


def test_a_chat_url_is_shown_masked_and_a_webhook_url_as_given():
    """A Slack or Teams incoming-webhook URL is the credential that posts to the channel: rules and
    delivery logs show its host and last four characters only; a signed webhook's URL stays whole."""
    slack = "https://hooks.slack.com/services/T0AAAA/B0BBBB/abcdefghijklmnopqrstwxyz"
    shown = [WebhookRecipient(url="https://hooks.slack.com/...wxyz")]
    assert domain.shown_recipients([Channel.SLACK], [WebhookRecipient(url=slack)]) == shown
    teams = [WebhookRecipient(url="https://x.webhook.office.com/workflows/abc/triggers/manual/paths/invoke?sig=s3cr3t")]
    assert domain.shown_recipients([Channel.TEAMS], teams) == [WebhookRecipient(url="https://x.webhook.office.com/...cr3t")]
    assert domain.shown_recipients([Channel.WEBHOOK], [WebhookRecipient(url=slack)]) == [WebhookRecipient(url=slack)]
    assert domain.shown_recipients([Channel.EMAIL], [EmailRecipient(email="ops@example.com")]) == [
        EmailRecipient(email="ops@example.com")
    ]
    assert domain.shown_delivery_recipient(Channel.SLACK, f"url:{slack}") == "url:https://hooks.slack.com/...wxyz"
    assert domain.shown_delivery_recipient(Channel.WEBHOOK, f"url:{slack}") == f"url:{slack}"
    assert domain.shown_delivery_recipient(Channel.EMAIL, "email:ops@example.com") == "email:ops@example.com"
    assert domain.masked_url("https://x.example/short") == "https://x.example/..."  # too short to show a part of
