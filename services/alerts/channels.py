"""The delivery channels behind one interface: in-site, e-mail (SMTP) and SMS (HTTP gateway).

Every send carries a stable message id derived from the delivery id (the e-mail's Message-ID,
the gateway's Idempotency-Key, the in-site row's unique delivery_id), so a receiver can drop
the one repeat that is possible: a crash after a channel accepted a message and before the
delivery was recorded as sent.
"""

from email.message import EmailMessage
from email.utils import formatdate
from pathlib import Path
from typing import Protocol
from uuid import UUID

import aiosmtplib
import httpx
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from contracts.alerts_api import Channel
from services.alerts import domain, store
from services.runtime.platform.settings import Settings

TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(enabled_extensions=("html", "html.j2")),
    undefined=StrictUndefined,
    keep_trailing_newline=True,
)
SEND_TIMEOUT_SECONDS = 10.0


class DeliveryError(Exception):
    """The channel could not send now; worth another attempt."""


class PermanentDeliveryError(DeliveryError):
    """Another attempt cannot help (no gateway configured, address refused...)."""


def render(template: str, message: domain.AlertMessage, delivery_id: UUID) -> str:
    return TEMPLATES.get_template(template).render(m=message, delivery_id=delivery_id)


def message_id(delivery_id: UUID) -> str:
    return f"<{delivery_id}@alerts.tollgate>"


class ChannelSender(Protocol):
    channel: Channel

    async def send(self, conn: store.Conn, delivery: store.PendingDelivery, message: domain.AlertMessage) -> None:
        """Send one message to `delivery.recipient`; raise DeliveryError on failure. `conn` holds
        the delivery's lock; a channel that writes to Postgres writes in that transaction."""
        ...


class InSiteChannel:
    """Stored in the same transaction that marks the delivery sent: no repeat window at all."""

    channel = Channel.IN_SITE

    async def send(self, conn: store.Conn, delivery: store.PendingDelivery, message: domain.AlertMessage) -> None:
        await store.insert_notification(conn, delivery.id, delivery.account_id, message)


class EmailChannel:
    channel = Channel.EMAIL

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    def compose(self, delivery: store.PendingDelivery, message: domain.AlertMessage) -> EmailMessage:
        mail = EmailMessage()
        mail["From"] = self._settings.mail_from
        mail["To"] = domain.address_of(delivery.recipient)
        mail["Subject"] = message.title
        mail["Date"] = formatdate(localtime=False)
        mail["Message-ID"] = message_id(delivery.id)
        mail.set_content(render("email.txt.j2", message, delivery.id))
        mail.add_alternative(render("email.html.j2", message, delivery.id), subtype="html")
        return mail

    async def send(self, conn: store.Conn, delivery: store.PendingDelivery, message: domain.AlertMessage) -> None:
        s = self._settings
        try:
            mail = self.compose(delivery, message)
        except ValueError as exc:
            # An address no header can hold (a member's e-mail, or one stored before the rule's
            # contract refused it): no attempt can ever send it; failed for good, and logged.
            raise PermanentDeliveryError(f"the address cannot be written in a header: {exc}") from exc
        try:
            await aiosmtplib.send(
                mail,
                # the envelope is the stored address, never what the To header parses into
                recipients=[domain.address_of(delivery.recipient)],
                hostname=s.smtp_host,
                port=s.smtp_port,
                username=s.smtp_username,
                password=s.smtp_password.get_secret_value() if s.smtp_password else None,
                start_tls=s.smtp_starttls,
                timeout=SEND_TIMEOUT_SECONDS,
            )
        except aiosmtplib.SMTPRecipientsRefused as exc:
            raise PermanentDeliveryError(f"recipient refused: {exc}") from exc
        except (aiosmtplib.SMTPException, OSError) as exc:
            raise DeliveryError(f"smtp: {exc!r}") from exc


class SmsChannel:
    """POSTs `{to, message, reference}` JSON with `Authorization: Bearer <token>` and
    `Idempotency-Key: <delivery id>` to the configured gateway; any 2xx is accepted."""

    channel = Channel.SMS

    def __init__(self, settings: Settings, client: httpx.AsyncClient | None = None) -> None:
        self._settings = settings
        self._client = client or httpx.AsyncClient(timeout=SEND_TIMEOUT_SECONDS)

    async def close(self) -> None:
        await self._client.aclose()

    async def send(self, conn: store.Conn, delivery: store.PendingDelivery, message: domain.AlertMessage) -> None:
        s = self._settings
        if not s.sms_gateway_url:
            raise PermanentDeliveryError("no SMS gateway is configured (SMS_GATEWAY_URL)")
        headers = {"Idempotency-Key": str(delivery.id)}
        if s.sms_gateway_token is not None:
            headers["Authorization"] = f"Bearer {s.sms_gateway_token.get_secret_value()}"
        body = {
            "to": domain.address_of(delivery.recipient),
            "message": render("sms.txt.j2", message, delivery.id).strip(),
            "reference": str(delivery.id),
        }
        try:
            response = await self._client.post(s.sms_gateway_url, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise DeliveryError(f"sms gateway: {exc!r}") from exc
        if response.is_success:
            return
        error = f"sms gateway answered {response.status_code}: {response.text[:200]}"
        if 400 <= response.status_code < 500 and response.status_code not in (408, 409, 425, 429):
            raise PermanentDeliveryError(error)
        raise DeliveryError(error)
