"""The alert rules without I/O: validation, which rules fire, creation firing, messages."""

import uuid
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from contracts.alerts_api import Channel, EmailRecipient, PhoneRecipient, RuleIn, UserRecipient
from contracts.common import AlertMetric, Resource
from services.alerts import domain
from services.alerts.domain import PlannedDelivery, RuleThreshold

ACCOUNT = uuid.UUID("00000000-0000-0000-0000-0000000000aa")
MAIL = EmailRecipient(email="Ops@Example.COM")
PHONE = PhoneRecipient(phone="+4915112345678")
ME = UserRecipient(user_id=ACCOUNT)


def _fields(problems: list[domain.Problem]) -> list[str]:
    return [p.field for p in problems]


def test_consistent_rules_pass():
    assert domain.validate_rule([Channel.IN_SITE], []) == []
    assert domain.validate_rule([Channel.IN_SITE, Channel.EMAIL, Channel.SMS], [MAIL, PHONE, ME]) == []


@pytest.mark.parametrize(
    ("channels", "recipients", "fields"),
    [
        ([Channel.EMAIL], [], ["recipients"]),  # email without an address
        ([Channel.SMS], [MAIL], ["channels", "recipients"]),  # an address without email; sms without a phone
        ([Channel.IN_SITE], [PHONE], ["channels"]),
        ([Channel.EMAIL], [MAIL, ME], ["channels"]),  # a user without in_site
        ([Channel.IN_SITE], [ME, UserRecipient(user_id=ACCOUNT)], ["recipients"]),  # the same user twice
        ([Channel.IN_SITE, Channel.IN_SITE], [], ["channels"]),
        ([Channel.EMAIL], [MAIL, EmailRecipient(email="Ops@example.com")], ["recipients"]),  # same address
    ],
)
def test_inconsistent_rules_name_the_field(channels, recipients, fields):
    assert _fields(domain.validate_rule(channels, recipients)) == fields


def test_a_user_recipient_must_be_a_live_user_of_the_account_whoever_else_it_is():
    member, stranger = uuid.uuid4(), uuid.uuid4()
    recipients = [MAIL, ME, UserRecipient(user_id=member), UserRecipient(user_id=stranger)]
    assert domain.validate_rule([Channel.IN_SITE, Channel.EMAIL], recipients) == []  # two users are two recipients
    assert domain.user_ids_to_check(ACCOUNT, recipients) == [member, stranger]  # the account's own id needs no look-up
    problems = domain.unknown_users(ACCOUNT, recipients, members={member})
    assert problems == [domain.Problem("recipients.3.user_id", "The user is not a user of this account.")]
    assert domain.unknown_users(ACCOUNT, recipients, members={member, stranger}) == []


def test_in_site_goes_once_to_the_account_inbox_however_many_users_the_rule_names():
    users = [ME, UserRecipient(user_id=uuid.uuid4()), UserRecipient(user_id=uuid.uuid4())]
    assert domain.plan_deliveries(ACCOUNT, [Channel.IN_SITE], users) == [PlannedDelivery(Channel.IN_SITE, f"account:{ACCOUNT}")]


@pytest.mark.parametrize(
    "body",
    [
        {"metric": "total_tokens", "threshold_pct": 0, "channels": ["in_site"]},
        {"metric": "total_tokens", "threshold_pct": 101, "channels": ["in_site"]},
        {"metric": "tokens", "threshold_pct": 50, "channels": ["in_site"]},
        {"metric": "storage", "threshold_pct": 50, "channels": []},
        {"metric": "storage", "threshold_pct": 50, "channels": ["fax"]},
        {"metric": "storage", "threshold_pct": 50, "channels": ["email"], "recipients": [{"email": "nobody"}]},
        {"metric": "storage", "threshold_pct": 50, "channels": ["sms"], "recipients": [{"phone": "0151 123"}]},
        {"metric": "storage", "threshold_pct": 50, "channels": ["sms"], "recipients": [{"phone": "+491", "email": "a@b.c"}]},
        {"metric": "storage", "threshold_pct": 50, "channels": ["in_site"], "extra": 1},
    ],
)
def test_the_schema_refuses_bad_bodies(body):
    with pytest.raises(ValidationError):
        RuleIn.model_validate(body)


def test_deliveries_are_one_per_channel_and_recipient_and_in_site_goes_to_the_account():
    planned = domain.plan_deliveries(ACCOUNT, [Channel.IN_SITE, Channel.EMAIL, Channel.SMS], [MAIL, PHONE, ME])
    assert planned == [
        PlannedDelivery(Channel.IN_SITE, f"account:{ACCOUNT}"),
        PlannedDelivery(Channel.EMAIL, "email:Ops@example.com"),
        PlannedDelivery(Channel.SMS, "phone:+4915112345678"),
    ]
    assert domain.address_of(planned[1].recipient) == "Ops@example.com"


def test_a_jump_fires_every_rule_at_or_below_the_crossing_not_yet_fired():
    r50, r80, r90, r99 = (RuleThreshold(uuid.uuid4(), t) for t in (50, 80, 90, 99))
    assert domain.rules_to_fire([r99, r90, r80, r50], 95, already_fired={r50.rule_id}) == [r80, r90]
    assert domain.rules_to_fire([r80, r90], 95, already_fired={r80.rule_id, r90.rule_id}) == []
    assert domain.rules_to_fire([r80], 79, already_fired=set()) == []
    assert domain.rules_to_fire([r80], 80, already_fired=set()) == [r80]


@given(
    thresholds=st.lists(st.integers(1, 100), max_size=12),
    crossings=st.lists(st.integers(1, 100), min_size=1, max_size=20),
)
def test_any_sequence_of_crossings_fires_each_reached_rule_exactly_once(thresholds, crossings):
    rules = [RuleThreshold(uuid.uuid4(), t) for t in thresholds]
    fired: list[uuid.UUID] = []
    for pct in crossings:
        fired += [r.rule_id for r in domain.rules_to_fire(rules, pct, set(fired))]
    assert len(fired) == len(set(fired))
    assert set(fired) == {r.rule_id for r in rules if r.threshold_pct <= max(crossings)}


def test_usage_rate_and_creation_firing():
    assert domain.usage_rate(1, 3) == Decimal("33.33")
    assert domain.usage_rate(2, 3) == Decimal("66.67")
    assert domain.usage_rate(5, 0) == Decimal("100.00")
    assert domain.usage_rate(0, 0) == Decimal("0.00")
    now = "2026-11"
    assert domain.fires_at_creation(80, Resource.AI_TOKENS, now, 800, 1000, now)
    assert not domain.fires_at_creation(80, Resource.AI_TOKENS, now, 799, 1000, now)
    assert not domain.fires_at_creation(80, Resource.AI_TOKENS, now, 79_995, 100_000, now)  # shown as 80.00%
    assert domain.fires_at_creation(80, Resource.AI_TOKENS, now, 80_000, 100_000, now)
    assert not domain.fires_at_creation(80, Resource.AI_TOKENS, "2026-10", 900, 1000, now)  # a flow resets
    assert domain.fires_at_creation(80, Resource.STORAGE_BYTES, "2026-10", 900, 1000, now)  # a stock carries over
    assert not domain.fires_at_creation(1, Resource.AI_TOKENS, None, 0, 0, now)


def test_every_message_names_metric_threshold_usage_limit_and_links():
    links = domain.links_for("https://console.example/", Resource.STORAGE_BYTES)
    assert links == domain.Links("https://console.example/plan", "https://console.example/quota?buy=storage_bytes")
    message = domain.AlertMessage(AlertMetric.STORAGE, 90, 9_500_000, 10_000_000, "2026-11", links)
    assert message.resource is Resource.STORAGE_BYTES
    assert "storage" in message.title and "90%" in message.title
    assert message.summary() == (
        "Your storage usage reached 90% alert threshold in 2026-11: 9,500,000 used of a 10,000,000 limit (95.00%)."
    )
