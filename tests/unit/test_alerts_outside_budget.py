"""The daily budget of outside alert messages and the cap on rules per account, on fakes
(services/alerts/service.py, domain.OutsideBudget): the pumping loop (create a rule that fires at
creation, delete it, again) stops sending e-mail and SMS at the budget; in-site never stops."""

import logging
import uuid
from datetime import UTC, datetime

import pytest
from prometheus_client import REGISTRY

from contracts.alerts_api import Channel, EmailRecipient, PhoneRecipient, RuleIn
from contracts.common import AlertMetric, Resource
from contracts.domain_errors import Invalid
from contracts.events import QuotaState, QuotaThresholdCrossed
from services.alerts import domain
from tests.unit.fakes import ACTOR, AlertsWorld

BUDGET = 4


@pytest.fixture
def world() -> AlertsWorld:
    return AlertsWorld(datetime(2026, 11, 15, 12, 0, tzinfo=UTC), outside_messages_per_day=BUDGET, max_rules=5)


def pumping_rule(n: int, threshold: int = 1) -> RuleIn:
    """A fresh outside address each time: per-recipient dedupe would not stop it."""
    return RuleIn(
        metric=AlertMetric.TOTAL_TOKENS,
        threshold_pct=threshold,
        channels=[Channel.IN_SITE, Channel.EMAIL, Channel.SMS],
        recipients=[EmailRecipient(email=f"victim{n}@example.com"), PhoneRecipient(phone=f"+491511234{n:04d}")],
    )


async def passed(world: AlertsWorld, account: uuid.UUID, pct: int = 2) -> None:
    """The account's AI tokens at `pct`% this period: a rule at or below it fires at its creation."""
    await world.service.save_quota_state(
        QuotaState(
            time=world.clock(),
            account_id=account,
            resource=Resource.AI_TOKENS,
            period="2026-11",
            total=100,
            used=pct,
            blocked=False,
        )
    )


def held_back_metric(channel: str) -> float:
    return REGISTRY.get_sample_value("tollgate_alerts_held_back_total", {"channel": channel}) or 0.0


async def test_the_create_delete_loop_stops_sending_outside_at_the_budget_and_in_site_goes_on(world, caplog):
    account = uuid.uuid4()
    await passed(world, account)
    sms_before = held_back_metric("sms")
    caplog.set_level(logging.WARNING, logger="services.alerts.service")

    last = None
    for n in range(5):
        last = await world.service.create_rule(account, pumping_rule(n), audit=ACTOR)
        assert last.fired_this_period
        if n < 4:
            await world.service.delete_rule(account, last.id, audit=ACTOR)

    sent = world.submitted_channels()
    assert sent.count(Channel.IN_SITE) == 5  # every firing still reaches the inbox
    assert sent.count(Channel.EMAIL) + sent.count(Channel.SMS) == BUDGET
    assert world.store.outside_messages[(account, "2026-11-15")] == (BUDGET, 10 - BUDGET)
    assert held_back_metric("sms") - sms_before == 3
    # one log line for the account that day, however many messages were held back
    lines = [r for r in caplog.records if "daily limit" in r.getMessage()]
    assert len(lines) == 1 and str(account) in lines[0].getMessage()

    # the last rule's log shows its two outside messages as failed, with why; in-site is pending
    log = (await world.service.deliveries(account, last.id)).items
    by_channel = {d.channel: d for d in log}
    assert by_channel[Channel.IN_SITE].status == "pending" and by_channel[Channel.IN_SITE].error is None
    for channel in (Channel.EMAIL, Channel.SMS):
        item = by_channel[channel]
        assert item.status == "failed" and item.attempt == 0 and item.next_attempt_at is None
        assert item.error and "daily limit of 4 outside alert messages" in item.error
    assert (await world.service.list_rules(account)).rules[0].failed_deliveries == 2


async def test_the_budget_is_per_account_and_per_day(world):
    mine, other = uuid.uuid4(), uuid.uuid4()
    for account in (mine, other):
        await passed(world, account)
    for n in range(3):
        await world.service.create_rule(mine, pumping_rule(n), audit=ACTOR)
    outside = [c for c in world.submitted_channels() if c is not Channel.IN_SITE]
    assert len(outside) == BUDGET

    world.deliver.submitted.clear()
    await world.service.create_rule(other, pumping_rule(9), audit=ACTOR)  # another account: its own budget
    assert world.submitted_channels().count(Channel.EMAIL) == 1

    world.deliver.submitted.clear()
    world.clock.now = datetime(2026, 11, 16, 0, 0, 1, tzinfo=UTC)  # a new day in the platform time zone
    await world.service.create_rule(mine, pumping_rule(5), audit=ACTOR)
    assert sorted(world.submitted_channels()) == sorted([Channel.IN_SITE, Channel.EMAIL, Channel.SMS])

    world.clock.now = datetime(2026, 11, 17, tzinfo=UTC)
    assert await world.service.forget_old_budgets() == 2  # the 15th's two rows; the 16th is yesterday: kept
    assert {day for _, day in world.store.outside_messages} == {"2026-11-16"}


async def test_a_crossing_is_budgeted_too_and_webhooks_count(world):
    account = uuid.uuid4()
    hook = RuleIn(
        metric=AlertMetric.TOTAL_TOKENS,
        threshold_pct=50,
        channels=[Channel.WEBHOOK],
        recipients=[{"url": f"https://hooks.example.com/{n}"} for n in range(3)],  # type: ignore[list-item]
    )
    await world.service.create_rule(account, hook, audit=ACTOR)
    await world.service.create_rule(account, pumping_rule(1, threshold=60), audit=ACTOR)
    await world.service.fire_crossing(
        QuotaThresholdCrossed(
            time=datetime(2026, 11, 15, tzinfo=UTC),
            account_id=account,
            resource=Resource.AI_TOKENS,
            period="2026-11",
            threshold_pct=70,
            used=70,
            total=100,
        )
    )
    sent = world.submitted_channels()
    # rules in threshold order: the 50% rule's 3 webhooks, then the 60% rule's in-site and 1 of 2
    assert sent.count(Channel.WEBHOOK) == 3 and sent.count(Channel.IN_SITE) == 1
    assert sent.count(Channel.EMAIL) + sent.count(Channel.SMS) == 1
    assert [d["status"] for d in world.store.deliveries.values()].count("failed") == 1


async def test_a_rule_past_the_cap_is_422_and_a_deleted_one_frees_its_place(world):
    account = uuid.uuid4()
    rules = [await world.service.create_rule(account, pumping_rule(n, threshold=90), audit=ACTOR) for n in range(5)]
    with pytest.raises(Invalid) as refused:
        await world.service.create_rule(account, pumping_rule(6, threshold=90), audit=ACTOR)
    assert refused.value.details == [{"field": "rules", "message": "At most 5 alert rules per account.", "type": "too_many"}]
    assert len((await world.service.list_rules(account)).rules) == 5
    await world.service.create_rule(uuid.uuid4(), pumping_rule(6, threshold=90), audit=ACTOR)  # another account: its own cap
    await world.service.delete_rule(account, rules[0].id, audit=ACTOR)
    await world.service.create_rule(account, pumping_rule(6, threshold=90), audit=ACTOR)


def test_split_never_holds_back_in_site_and_keeps_the_order():
    account = uuid.uuid4()
    planned = domain.plan_deliveries(
        account,
        [Channel.EMAIL, Channel.IN_SITE, Channel.SMS],
        [EmailRecipient(email="a@example.com"), EmailRecipient(email="b@example.com"), PhoneRecipient(phone="+4915112345678")],
    )
    budget = domain.OutsideBudget("2026-11-15", per_day=3, queued=1)
    sent, held = budget.split(planned)
    assert [(d.channel, d.recipient) for d in sent] == [
        (Channel.EMAIL, "email:a@example.com"),
        (Channel.EMAIL, "email:b@example.com"),
        (Channel.IN_SITE, f"account:{account}"),
    ]
    assert [d.channel for d in held] == [Channel.SMS] and budget.held_back == [Channel.SMS]
    assert (budget.queued, budget.suppressed, budget.first_reached) == (3, 1, True)
    again = domain.OutsideBudget("2026-11-15", per_day=3, queued=3, suppressed=1)
    assert again.split(planned)[0] == [planned[2]] and not again.first_reached  # logged once already
    assert domain.OutsideBudget("d", per_day=0).split(planned)[0] == [planned[2]]  # 0: in-site only
