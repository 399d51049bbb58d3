"""Message rendering: multipart e-mail from the templates, escaped HTML, SMS text, stable ids."""

import uuid
from datetime import UTC, datetime

import aiosmtplib
import pytest
from pydantic import ValidationError

from contracts.alerts_api import Channel, EmailRecipient
from contracts.common import AlertMetric
from services.alerts import domain, store
from services.alerts.channels import EmailChannel, PermanentDeliveryError, message_id, render
from services.runtime.platform.settings import Settings

DELIVERY = uuid.UUID("11111111-2222-3333-4444-555555555555")
LINKS = domain.links_for("https://console.example", domain.METRIC_RESOURCE[AlertMetric.TOTAL_TOKENS])
MESSAGE = domain.AlertMessage(AlertMetric.TOTAL_TOKENS, 80, 95_000, 100_000, "2026-11", LINKS)


def _pending(recipient: str) -> store.PendingDelivery:
    return store.PendingDelivery(
        DELIVERY,
        uuid.uuid4(),
        Channel.EMAIL,
        recipient,
        0,
        AlertMetric.TOTAL_TOKENS,
        80,
        "2026-11",
        95_000,
        100_000,
        rule_id=uuid.uuid4(),
        created_at=datetime.now(UTC),
        fired_at=datetime.now(UTC),
    )


def test_the_email_is_multipart_text_and_html_with_a_stable_message_id():
    mail = EmailChannel(Settings(mail_from="Alerts <a@t.example>")).compose(_pending("email:ops@example.com"), MESSAGE)
    assert mail["To"] == "ops@example.com" and mail["From"] == "Alerts <a@t.example>"
    assert mail["Message-ID"] == message_id(DELIVERY) == f"<{DELIVERY}@alerts.tollgate>"
    assert "total_tokens" in mail["Subject"] and "80%" in mail["Subject"]
    text = mail.get_body(("plain",)).get_content()
    html = mail.get_body(("html",)).get_content()
    for body in (text, html):
        assert "total_tokens" in body and "80%" in body and "95,000" in body and "100,000" in body and "95.00%" in body
        assert "https://console.example/plan" in body and "https://console.example/quota?buy=ai_tokens" in body
    assert '<a href="https://console.example/plan">' in html


def test_html_escapes_and_the_sms_is_one_line():
    hostile = domain.AlertMessage(AlertMetric.API_CALLS, 90, 1, 2, "2026-11", domain.Links("x<script>", "y&z"))
    html = render("email.html.j2", hostile, DELIVERY)
    assert "<script>" not in html and "x&lt;script&gt;" in html and "y&amp;z" in html
    sms = render("sms.txt.j2", MESSAGE, DELIVERY).strip()
    assert "\n" not in sms
    assert "total_tokens" in sms and "80%" in sms and "95,000" in sms and "100,000" in sms
    assert "https://console.example/plan" in sms and "https://console.example/quota?buy=ai_tokens" in sms


# One {email} recipient is one mailbox: an address the headers would read as several (a comma, a
# group's colon, angle brackets in its local part) is refused, and the envelope names exactly the
# stored address, whatever its To header parses into.
@pytest.mark.parametrize("email", ["root,ops@example.com", "a;b@example.com", "x:ops@example.com", "ops>,<root@example.com"])
def test_an_email_recipient_with_address_separators_is_refused(email):
    with pytest.raises(ValidationError):
        EmailRecipient(email=email)


async def test_the_smtp_envelope_names_the_stored_address_alone(monkeypatch):
    sent: list[dict[str, object]] = []

    async def fake_send(message, **kwargs):
        sent.append(kwargs)

    monkeypatch.setattr(aiosmtplib, "send", fake_send)
    channel = EmailChannel(Settings(mail_from="a@t.example"))
    await channel.send(None, _pending("email:root,ops@example.com"), MESSAGE)  # stored before the rule tightened
    assert sent[0]["recipients"] == ["root,ops@example.com"]


# Python reads \x1c, \x1d and \x1e as line breaks (str.splitlines), so the e-mail library refuses a
# header that holds one; the contract's `\s` (Unicode White_Space, checked by pydantic-core) does not
# cover them. Such an address was accepted, and each of its deliveries raised ValueError out of the
# channel: left pending, unlogged, tried again at every sweep for ever.
CONTROL = [
    "a\x1cb@example.com",
    "a\x1db@example.com",
    "a\x1eb@example.com",
    "ops@example.com\x1e",
    "a\x00b@example.com",
    "a\x7f@example.com",
]


@pytest.mark.parametrize("email", CONTROL)
def test_an_email_recipient_with_control_characters_is_refused(email):
    with pytest.raises(ValidationError):
        EmailRecipient(email=email)


@pytest.mark.parametrize("email", CONTROL[:3])
async def test_a_stored_address_no_header_can_hold_fails_for_good(monkeypatch, email):
    """Stored before the contract tightened (or a member's e-mail, which another contract checks):
    the delivery fails for good, logged, instead of raising out of the channel."""
    sent: list[object] = []

    async def fake_send(message, **kwargs):
        sent.append(message)

    monkeypatch.setattr(aiosmtplib, "send", fake_send)
    channel = EmailChannel(Settings(mail_from="a@t.example"))
    with pytest.raises(PermanentDeliveryError, match="cannot be written"):
        await channel.send(None, _pending(f"email:{email}"), MESSAGE)
    assert sent == []
