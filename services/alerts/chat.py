"""The Slack and Microsoft Teams messages (v4): an alert in each platform's incoming-webhook format.

Both are webhook deliveries (services/alerts/webhook.py: SSRF guard, retries, delivery log) with
another body and no Tollgate-Signature, which neither platform checks. The bodies are built as
data, not rendered from templates: JSON encoding is then structural, and the only text escaping
left is Slack's mrkdwn (`&`, `<`, `>`), applied to every text that is not Tollgate's own literal.

- Slack: `{text, blocks}`; `text` is the fallback (notifications, clients without Block Kit),
  `blocks` a header, a mrkdwn section with the facts and the links, and a context line. Slack
  answers 200 with the body `ok`; errors name themselves (`invalid_payload`, `no_service`...).
- Teams (Workflows "post to a channel when a webhook request is received"): a message with one
  Adaptive Card 1.4 attachment, links as `Action.OpenUrl`. It answers 202 (or 200).
"""

from typing import Any
from uuid import UUID

from contracts.alerts_api import Channel
from services.alerts import domain

SLACK_OK_BODY = "ok"
ADAPTIVE_CARD = "application/vnd.microsoft.card.adaptive"
ADAPTIVE_CARD_SCHEMA = "http://adaptivecards.io/schemas/adaptive-card.json"
ADAPTIVE_CARD_VERSION = "1.4"  # what Teams renders in channels and chats
SLACK_HEADER_MAX = 150  # Block Kit: a header's plain_text is at most 150 characters


def slack_escape(text: str) -> str:
    """Slack mrkdwn's control characters as the entities Slack decodes (and only these)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack_link(url: str, label: str) -> str:
    return f"<{slack_escape(url)}|{slack_escape(label)}>"


def _facts(message: domain.AlertMessage) -> list[tuple[str, str]]:
    key = [("API key", message.key.key_name), ("Key limit", message.key.limit_name)] if message.key else []
    return [
        *key,
        ("Metric", message.metric.value),
        ("Threshold", f"{message.threshold_pct}%"),
        ("Usage", f"{message.used:,} ({message.usage_pct}%)"),
        ("Limit", f"{message.total:,}"),
        ("Period", message.period),
    ]


def _link_labels(message: domain.AlertMessage) -> list[tuple[str, str]]:
    return [("Upgrade your plan", message.links.upgrade_plan), ("Buy a quota package", message.links.buy_quota_package)]


def slack_message(message: domain.AlertMessage, delivery_id: UUID) -> dict[str, Any]:
    links = " · ".join(_slack_link(url, label) for label, url in _link_labels(message))
    facts = "\n".join(f"*{name}:* {slack_escape(value)}" for name, value in _facts(message))
    summary = slack_escape(message.summary())
    return {
        "text": f"{slack_escape(message.title)}\n{summary} {links}",
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": message.title[:SLACK_HEADER_MAX], "emoji": False}},
            {"type": "section", "text": {"type": "mrkdwn", "text": f"{summary}\n\n{facts}"}},
            {"type": "section", "text": {"type": "mrkdwn", "text": links}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": f"Tollgate usage alert · message {delivery_id}"}]},
        ],
    }


def teams_message(message: domain.AlertMessage, delivery_id: UUID) -> dict[str, Any]:
    card = {
        "type": "AdaptiveCard",
        "$schema": ADAPTIVE_CARD_SCHEMA,
        "version": ADAPTIVE_CARD_VERSION,
        "body": [
            {"type": "TextBlock", "text": message.title, "weight": "Bolder", "size": "Medium", "wrap": True},
            {"type": "TextBlock", "text": message.summary(), "wrap": True},
            {"type": "FactSet", "facts": [{"title": name, "value": value} for name, value in _facts(message)]},
            {
                "type": "TextBlock",
                "text": f"Tollgate usage alert · message {delivery_id}",
                "isSubtle": True,
                "size": "Small",
                "wrap": True,
            },
        ],
        "actions": [{"type": "Action.OpenUrl", "title": label, "url": url} for label, url in _link_labels(message)],
    }
    return {"type": "message", "attachments": [{"contentType": ADAPTIVE_CARD, "contentUrl": None, "content": card}]}


def chat_message(channel: Channel, message: domain.AlertMessage, delivery_id: UUID) -> dict[str, Any]:
    if channel is Channel.SLACK:
        return slack_message(message, delivery_id)
    if channel is Channel.TEAMS:
        return teams_message(message, delivery_id)
    raise ValueError(f"{channel.value} is not a chat channel")
