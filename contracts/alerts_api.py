"""Payloads of the alerts API (API.md, "Alerts"); extensions are marked as such."""

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from contracts.common import AlertMetric


class Channel(StrEnum):
    IN_SITE = "in_site"
    EMAIL = "email"
    SMS = "sms"
    WEBHOOK = "webhook"  # v2
    SLACK = "slack"  # v4: a Slack incoming webhook
    TEAMS = "teams"  # v4: a Microsoft Teams (Workflows) incoming webhook


# The channels that POST to the rule's `{url}` recipients (one of them per rule).
URL_CHANNELS = (Channel.WEBHOOK, Channel.SLACK, Channel.TEAMS)


class DeliveryStatus(StrEnum):
    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"


# A pragmatic address check (no DNS, no dependency): one @, no spaces, a dot in the domain, and
# none of the characters a header reads as address syntax (`,` `;` `:` `<` `>` `(` `)` `[` `]`
# `"` `\`): `root,ops@example.com` in a To header is two recipients, `root` delivered locally.
# Nor control characters: Python reads \x1c-\x1e as line breaks, which no header may hold (and
# `\s`, Unicode White_Space as pydantic-core checks it, does not cover them).
_ATOM = r'[^@\s,;:<>()\[\]"\\\x00-\x1f\x7f]'
EMAIL_PATTERN = rf"^{_ATOM}{{1,64}}@{_ATOM}+\.{_ATOM}+$"
# E.164: a plus, a country code that does not start with 0, at most 15 digits in all.
PHONE_PATTERN = r"^\+[1-9]\d{6,14}$"


class EmailRecipient(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    email: str = Field(pattern=EMAIL_PATTERN, max_length=254, examples=["ops@example.com"])


class PhoneRecipient(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    phone: str = Field(pattern=PHONE_PATTERN, examples=["+4915112345678"], description="E.164")


class UserRecipient(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    user_id: UUID = Field(description="A user of this account; the addressee of the in-site notification.")


class WebhookRecipient(BaseModel):
    """(v2) The URL the `webhook` channel POSTs to; http(s) only, and it must not resolve to a
    loopback, private or link-local address (checked again at every delivery). (v4) Also the
    incoming-webhook URL of the `slack` and `teams` channels, which must be https."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    url: str = Field(min_length=1, max_length=2048, examples=["https://hooks.example.com/tollgate"])


Recipient = EmailRecipient | PhoneRecipient | UserRecipient | WebhookRecipient


class RuleScope(BaseModel):
    """(v4) What a rule watches: one API key's own limits on the metric's resource. A rule without
    a scope watches the account's quota, as before."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    api_key_id: UUID = Field(description="One of the account's keys (else 422, as for any other reference in a rule).")


class RuleIn(BaseModel):
    """`POST /api/ai/usage/alert`."""

    model_config = ConfigDict(extra="forbid")

    metric: AlertMetric
    threshold_pct: int = Field(ge=1, le=100)
    channels: Annotated[list[Channel], Field(min_length=1, max_length=len(Channel))]
    recipients: Annotated[list[Recipient], Field(default_factory=list, max_length=20)]
    scope: RuleScope | None = None  # v4


class RuleOut(BaseModel):
    id: UUID
    metric: AlertMetric
    threshold_pct: int
    channels: list[Channel]
    recipients: list[Recipient]
    # (v4) null: the account's quota. `fired_this_period` is then "in a window that holds now"
    # (today, this ISO week, this month, or ever for a `once` limit).
    scope: RuleScope | None = None
    created_at: AwareDatetime
    fired_this_period: bool
    last_fired_at: AwareDatetime | None
    # Extension: deliveries of this rule that exhausted their retries (see .../deliveries).
    failed_deliveries: int = 0


class RuleCreated(RuleOut):
    """The 201 of a rule's creation: (v2) a rule with the `webhook` channel carries its signing
    secret here, once; no other response returns it."""

    webhook_secret: str | None = None


class RuleList(BaseModel):
    rules: list[RuleOut]


class DeliveryOut(BaseModel):
    """(v2) One attempt to send one message (one firing, channel and recipient): `id`, `time`,
    `attempt` (1, 2, ...), `status_code` (the webhook receiver's HTTP status, else null), `error`
    and `next_attempt_at` (when the next attempt is due; null when none is). A message not tried
    yet is one item with `attempt` 0. Extension: the message's own fields follow (`delivery_id`,
    its `status`, total `attempts`, `last_error`, ...)."""

    id: UUID
    time: datetime
    attempt: int
    status_code: int | None
    error: str | None
    next_attempt_at: datetime | None
    delivery_id: UUID
    firing_id: UUID
    period: str
    threshold_pct: int
    channel: Channel
    recipient: str
    status: DeliveryStatus
    attempts: int
    last_error: str | None
    created_at: datetime
    sent_at: datetime | None


class DeliveryList(BaseModel):
    items: list[DeliveryOut]


class NotificationLinks(BaseModel):
    upgrade_plan: str
    buy_quota_package: str


NotificationKind = Literal["quota_threshold", "key_rotation_due"]


class NotificationOut(BaseModel):
    """(v2) `kind`: a rule's quota alert (`quota_threshold`: metric, threshold_pct and the quota
    links), or the one reminder to rotate a key older than 90 days (`key_rotation_due`: metric and
    threshold_pct null, `api_key_id` names the key, links `{}`)."""

    id: UUID
    created_at: AwareDatetime
    title: str
    message: str
    metric: AlertMetric | None
    threshold_pct: int | None
    links: NotificationLinks | dict[str, str]
    read: bool
    kind: NotificationKind = "quota_threshold"
    api_key_id: UUID | None = None


class NotificationList(BaseModel):
    items: list[NotificationOut]
