"""The alert rules, free of I/O: what a rule accepts, when it fires, what it sends to whom."""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from urllib.parse import urlsplit
from uuid import UUID

from contracts.alerts_api import (
    URL_CHANNELS,
    Channel,
    EmailRecipient,
    PhoneRecipient,
    Recipient,
    UserRecipient,
    WebhookRecipient,
)
from contracts.common import METRIC_RESOURCE, STOCK_RESOURCES, AlertMetric, Resource
from contracts.key_limits import LimitPeriod
from contracts.quota_api import quota_links
from services.alerts import targets

# The channels that post to Slack's and Teams' incoming webhooks (v4): https, unsigned.
CHAT_CHANNELS = frozenset({Channel.SLACK, Channel.TEAMS})

# ---- rule validation --------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One reason a rule body is refused; reported in the 422's `details` like schema errors."""

    field: str
    message: str
    type: str = "value_error"


def validate_rule(channels: Sequence[Channel], recipients: Sequence[Recipient]) -> list[Problem]:
    """Channels and recipients must fit each other, so no recipient is silently ignored:

    - `email` needs at least one `{email}` recipient, and an `{email}` recipient needs `email`;
    - `sms` likewise with `{phone}`, and `webhook` (v2), `slack` and `teams` (v4) with `{url}`,
      which must be http(s) (https for Slack and Teams, and where it resolves to, are checked by
      the caller: they need the operator setting and the resolver). A rule names one of these
      three: they share the `{url}` recipients, and a Tollgate webhook body posted to a Slack URL
      (or a Slack message to a Teams one) would only be refused there;
    - `in_site` needs no recipient: it lands in the account's inbox (`GET /api/notifications`).
      A `{user_id}` recipient names a user of the account who reads that inbox and needs
      `in_site`; whether the id is one of the account's users is `unknown_users`' question (it
      needs the users alerts has learnt from users.v1).
    """
    problems: list[Problem] = []
    if len(set(channels)) != len(channels):
        problems.append(Problem("channels", "Each channel may appear once."))
    keys = [recipient_key(r) for r in recipients]
    if len(set(keys)) != len(keys):
        problems.append(Problem("recipients", "Each recipient may appear once."))
    kinds = {type(r) for r in recipients}
    wanted = set(channels)
    judged: set[type[Recipient]] = set()
    for channel, kind, what in _ADDRESSED:
        if channel in wanted and kind not in kinds:
            problems.append(Problem("recipients", f"The {channel.value} channel needs at least one {{{what}}} recipient."))
        if kind in kinds and kind not in judged:
            judged.add(kind)
            fitting = [c.value for c, k, _ in _ADDRESSED if k is kind]
            if wanted.isdisjoint(fitting):
                problems.append(Problem("channels", f"A {{{what}}} recipient needs the {' or '.join(fitting)} channel."))
    if len(wanted.intersection(URL_CHANNELS)) > 1:
        names = ", ".join(c.value for c in URL_CHANNELS)
        problems.append(Problem("channels", f"A rule may name only one of {names}: they share the {{url}} recipients."))
    if UserRecipient in kinds and Channel.IN_SITE not in wanted:
        problems.append(Problem("channels", "A {user_id} recipient needs the in_site channel."))
    for index, recipient in enumerate(recipients):
        if isinstance(recipient, WebhookRecipient):
            try:
                targets.parse_target(recipient.url)
            except targets.TargetError as exc:
                problems.append(Problem(f"recipients.{index}.url", str(exc)))
    return problems


def user_ids_to_check(account_id: UUID, recipients: Sequence[Recipient]) -> list[UUID]:
    """The `{user_id}` recipients to look up among the account's users: all but the account's own
    id, which is its registering user's (an account from before members never published it)."""
    return [r.user_id for r in recipients if isinstance(r, UserRecipient) and r.user_id != account_id]


def unknown_users(account_id: UUID, recipients: Sequence[Recipient], members: set[UUID]) -> list[Problem]:
    """A `{user_id}` recipient that is not a live user of the account (`members`: those of
    `user_ids_to_check` that are): unknown, removed and another account's users get the same
    answer, so the refusal tells nothing about other accounts."""
    return [
        Problem(f"recipients.{index}.user_id", "The user is not a user of this account.")
        for index, r in enumerate(recipients)
        if isinstance(r, UserRecipient) and r.user_id != account_id and r.user_id not in members
    ]


# The channels that send to addresses named in the rule, with the recipient kind each needs.
_ADDRESSED: tuple[tuple[Channel, type[Recipient], str], ...] = (
    (Channel.EMAIL, EmailRecipient, "email"),
    (Channel.SMS, PhoneRecipient, "phone"),
    (Channel.WEBHOOK, WebhookRecipient, "url"),
    (Channel.SLACK, WebhookRecipient, "url"),
    (Channel.TEAMS, WebhookRecipient, "url"),
)


def recipient_key(recipient: Recipient) -> str:
    """The normal form a recipient is unique on: `email:a@b.c`, `phone:+49...`, `url:...`,
    `user:<id>` (deliveries use it for the addressed channels; in-site goes to `account:<id>`)."""
    if isinstance(recipient, EmailRecipient):
        local, _, domain = recipient.email.partition("@")
        return f"email:{local}@{domain.lower()}"
    if isinstance(recipient, PhoneRecipient):
        return f"phone:{recipient.phone}"
    if isinstance(recipient, WebhookRecipient):
        return f"url:{recipient.url.strip()}"
    return f"user:{recipient.user_id}"


def shown_recipients(channels: Iterable[Channel], recipients: Sequence[Recipient]) -> list[Recipient]:
    """A rule's recipients as every answer shows them: a Slack or Teams incoming-webhook URL is the
    credential that posts to the channel (neither platform checks a signature), so it is never shown
    again after it was given, like an API key or a webhook's signing secret: the rules and delivery
    logs are read by every role with `alerts:read` and by their API keys."""
    if not CHAT_CHANNELS.intersection(channels):
        return list(recipients)
    return [WebhookRecipient(url=masked_url(r.url)) if isinstance(r, WebhookRecipient) else r for r in recipients]


def shown_delivery_recipient(channel: Channel, key: str) -> str:
    """A delivery's recipient key as its log shows it (`shown_recipients`' rule)."""
    kind, _, address = key.partition(":")
    return f"{kind}:{masked_url(address)}" if channel in CHAT_CHANNELS and kind == "url" else key


def masked_url(url: str) -> str:
    """`https://hooks.slack.com/...wxyz`: the scheme and host to recognise it by, and the last
    four characters of its secret part (path and query), as a key's `masked_key` shows its own."""
    parts = urlsplit(url.strip())
    secret = parts.path + (f"?{parts.query}" if parts.query else "")
    return f"{parts.scheme}://{parts.netloc}/...{secret[-4:] if len(secret) > 16 else ''}"


def address_of(key: str) -> str:
    """The address part of a recipient key (the e-mail address, the phone number, the account)."""
    return key.partition(":")[2]


@dataclass(frozen=True)
class PlannedDelivery:
    channel: Channel
    recipient: str


def plan_deliveries(account_id: UUID, channels: Iterable[Channel], recipients: Sequence[Recipient]) -> list[PlannedDelivery]:
    """One message per channel and recipient; in-site goes once to the account's inbox, whichever
    of its users the rule names (every user of the account reads that one inbox)."""
    planned: list[PlannedDelivery] = []
    for channel in dict.fromkeys(channels):
        if channel is Channel.IN_SITE:
            planned.append(PlannedDelivery(channel, f"account:{account_id}"))
            continue
        kind = next(k for c, k, _ in _ADDRESSED if c is channel)
        keys = dict.fromkeys(recipient_key(r) for r in recipients if isinstance(r, kind))
        planned.extend(PlannedDelivery(channel, key) for key in keys)
    return planned


# ---- the daily budget of outside messages -------------------------------------------------------
# Every channel but in-site sends out of the platform: e-mail and SMS cost money per message (SMS
# pumping) and the sending domain's reputation; webhook, Slack and Teams posts hit hosts the account
# names without proving they are its own. In-site stays in the account's inbox and is never held back.
OUTSIDE_CHANNELS = frozenset(Channel) - {Channel.IN_SITE}


@dataclass
class OutsideBudget:
    """An account's outside messages of one day (`day`, ISO date in the platform time zone):
    `queued` so far of `per_day`, `suppressed` beyond it. Read with its row locked, so concurrent
    firings of one account take the last slots one after the other; `held_back` are the channels
    refused in this transaction (for the metric)."""

    day: str
    per_day: int
    queued: int = 0
    suppressed: int = 0
    held_back: list[Channel] = field(default_factory=list)
    _suppressed_before: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._suppressed_before = self.suppressed

    def split(self, planned: Sequence[PlannedDelivery]) -> tuple[list[PlannedDelivery], list[PlannedDelivery]]:
        """(sent, held back): in-site always goes; outside messages while the day has room, in order."""
        sent: list[PlannedDelivery] = []
        held: list[PlannedDelivery] = []
        for delivery in planned:
            if delivery.channel not in OUTSIDE_CHANNELS:
                sent.append(delivery)
            elif self.queued < self.per_day:
                self.queued += 1
                sent.append(delivery)
            else:
                self.suppressed += 1
                self.held_back.append(delivery.channel)
                held.append(delivery)
        return sent, held

    @property
    def first_reached(self) -> bool:
        """This transaction held back the day's first message: the one log line of the day."""
        return self._suppressed_before == 0 and self.suppressed > 0

    def reason(self) -> str:
        """The delivery log's `error` of a message held back."""
        return (
            f"not sent: the account's daily limit of {self.per_day} outside alert messages (e-mail, SMS, webhook, "
            f"Slack, Teams) is reached for {self.day}; in-site notifications still arrive"
        )


# ---- when a rule fires ------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleThreshold:
    rule_id: UUID
    threshold_pct: int


def rules_to_fire(rules: Iterable[RuleThreshold], crossed_pct: int, already_fired: set[UUID]) -> list[RuleThreshold]:
    """Every rule at or below the highest percent crossed that has not fired this period
    (a jump from 50% to 95% fires the 80% and the 90% rule)."""
    return sorted(
        (r for r in rules if r.threshold_pct <= crossed_pct and r.rule_id not in already_fired),
        key=lambda r: (r.threshold_pct, str(r.rule_id)),
    )


def usage_rate(used: int, total: int) -> Decimal:
    """Percent used, two decimals; a zero limit with any use counts as fully used."""
    if total <= 0:
        return Decimal(100 if used > 0 else 0).quantize(Decimal("0.01"))
    return (Decimal(used) * 100 / Decimal(total)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


def fires_at_creation(
    threshold_pct: int, resource: Resource, state_period: str | None, used: int, total: int, current_period: str
) -> bool:
    """A new rule whose threshold is already passed this period fires once at creation. A flow's
    usage from an earlier period does not count; a stock's level carries over."""
    if state_period is None:
        return False
    if resource not in STOCK_RESOURCES and state_period != current_period:
        return False
    if total <= 0:
        return usage_rate(used, total) >= threshold_pct
    # exact, as quota's crossings are (whole percents, rounded down): 79.995% is not 80%, though
    # usage_rate shows it as 80.00
    return used * 100 >= threshold_pct * total


# ---- what is sent ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Links:
    upgrade_plan: str
    buy_quota_package: str


def links_for(console_url: str, resource: Resource) -> Links:
    links = quota_links(console_url, resource)  # the format insufficient_quota errors use too
    return Links(upgrade_plan=links.upgrade_plan, buy_quota_package=links.buy_quota_package)


@dataclass(frozen=True)
class KeyLimitRef:
    """(v4) The key whose own limit was crossed: named by its masked form (never the secret; a key
    alerts has not heard of yet is named by its id) and the limit's period."""

    api_key_id: UUID
    masked_key: str | None
    limit_period: LimitPeriod | None

    @property
    def key_name(self) -> str:
        return self.masked_key or f"id {self.api_key_id}"

    @property
    def limit_name(self) -> str:
        return _LIMIT_NAMES[self.limit_period] if self.limit_period else "own"


_LIMIT_NAMES = {
    LimitPeriod.DAY: "daily",
    LimitPeriod.WEEK: "weekly",
    LimitPeriod.MONTH: "monthly",
    LimitPeriod.ONCE: "one-time",
}


@dataclass(frozen=True)
class AlertMessage:
    """The facts every channel's message names: metric, threshold, usage and limit, and links.
    (v4) `key`: the crossing was of one key's own limit (`period` is then the limit's window)."""

    metric: AlertMetric
    threshold_pct: int
    used: int
    total: int
    period: str
    links: Links
    key: KeyLimitRef | None = None

    @property
    def api_key_id(self) -> UUID | None:
        return self.key.api_key_id if self.key else None

    @property
    def resource(self) -> Resource:
        return METRIC_RESOURCE[self.metric]

    @property
    def usage_pct(self) -> Decimal:
        return usage_rate(self.used, self.total)

    @property
    def title(self) -> str:
        if self.key:
            return (
                f"Usage alert: {self.metric.value} of key {self.key.key_name} passed {self.threshold_pct}% "
                f"of its {self.key.limit_name} limit"
            )
        return f"Usage alert: {self.metric.value} passed {self.threshold_pct}% of your limit"

    def summary(self) -> str:
        """The plain sentence used by in-site notifications and as the template's core."""
        if self.key:
            return (
                f"The {self.metric.value} usage of API key {self.key.key_name} reached {self.threshold_pct}% alert "
                f"threshold of its {self.key.limit_name} limit in {self.period}: "
                f"{self.used:,} used of a {self.total:,} limit ({self.usage_pct}%)."
            )
        return (
            f"Your {self.metric.value} usage reached {self.threshold_pct}% alert threshold in {self.period}: "
            f"{self.used:,} used of a {self.total:,} limit ({self.usage_pct}%)."
        )


# ---- the rotation reminder (v2) -----------------------------------------------------------------
ROTATION_TITLE = "Rotate this key"


def rotation_message(masked_key: str | None) -> str:
    which = f"The API key {masked_key}" if masked_key else "This API key"
    return (
        f"{which} is older than 90 days. Create a new key, move your clients to it, then delete the old one "
        "(or rotate it with a grace period)."
    )
