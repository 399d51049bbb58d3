"""Every use case of services/alerts/service.py on fakes: rules, firing crossings once per
(rule, period), quota states, the inbox. No I/O (tests/unit/fakes.py)."""

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from contracts.alerts_api import Channel, EmailRecipient, RuleIn, UserRecipient, WebhookRecipient
from contracts.common import AlertMetric, KeyStatus, Resource, Role
from contracts.domain_errors import Invalid, NotFound
from contracts.events import KeyState, QuotaState, QuotaThresholdCrossed, UserState
from tests.unit.fakes import ACTOR, AlertsWorld

NOW = datetime(2026, 11, 15, 12, 0, tzinfo=UTC)


@pytest.fixture
def world() -> AlertsWorld:
    return AlertsWorld(NOW)


def rule(threshold: int, channels=(Channel.IN_SITE,), recipients=()) -> RuleIn:
    return RuleIn(metric=AlertMetric.TOTAL_TOKENS, threshold_pct=threshold, channels=list(channels), recipients=list(recipients))


def crossed(account: uuid.UUID, pct: int, period: str = "2026-11") -> QuotaThresholdCrossed:
    return QuotaThresholdCrossed(
        time=datetime(2026, 11, 15, tzinfo=UTC),
        account_id=account,
        resource=Resource.AI_TOKENS,
        period=period,
        threshold_pct=pct,
        used=pct * 1000,
        total=100_000,
    )


async def test_a_jump_from_50_to_95_fires_the_80_and_90_rules_once_per_period(world):
    account = uuid.uuid4()
    r80 = await world.service.create_rule(account, rule(80), audit=ACTOR)
    r90 = await world.service.create_rule(account, rule(90), audit=ACTOR)
    r99 = await world.service.create_rule(account, rule(99), audit=ACTOR)
    assert world.deliver.submitted == []  # nothing crossed at creation

    await world.service.fire_crossing(crossed(account, 50))
    assert world.deliver.submitted == []
    await world.service.fire_crossing(crossed(account, 95))
    assert len(world.deliver.submitted) == 2  # one in-site delivery per fired rule
    assert {f["rule_id"] for f in world.store.firings.values()} == {r80.id, r90.id}

    await world.service.fire_crossing(crossed(account, 95))  # a replay
    await world.service.fire_crossing(crossed(account, 97))  # a higher crossing in the same period
    assert len(world.deliver.submitted) == 2
    listed = {r.id: r for r in (await world.service.list_rules(account)).rules}
    assert listed[r80.id].fired_this_period and listed[r90.id].fired_this_period and not listed[r99.id].fired_this_period

    world.clock.now = datetime(2026, 12, 3, tzinfo=UTC)  # next period: fresh again
    assert not any(r.fired_this_period for r in (await world.service.list_rules(account)).rules)
    await world.service.fire_crossing(crossed(account, 85, period="2026-12"))
    assert len(world.deliver.submitted) == 3
    assert {(f["rule_id"], f["period"]) for f in world.store.firings.values()} >= {(r80.id, "2026-12")}


async def test_a_late_crossing_of_a_period_over_before_the_rule_was_made_does_not_fire_it(world):
    """A lagging or replayed quota-thresholds.v1 event of an old month must not alert about it
    through a rule made after that month (it fires for crossings of its own periods only)."""
    account = uuid.uuid4()
    made = await world.service.create_rule(account, rule(80), audit=ACTOR)
    made_in = world.store.rules[made.id].created_at.strftime("%Y-%m")
    old = crossed(account, 95, period="2020-01")
    await world.service.fire_crossing(old)
    assert world.deliver.submitted == [] and world.store.firings == {}
    await world.service.fire_crossing(crossed(account, 95, period=made_in))  # its own period: fires
    assert len(world.deliver.submitted) == 1


async def test_a_batch_of_quota_states_keeps_the_newest_of_each_resource_in_one_write_each(world):
    account = uuid.uuid4()
    newer = QuotaState(
        time=world.clock(), account_id=account, resource=Resource.AI_TOKENS, period="2026-11", total=100, used=85, blocked=False
    )
    older = newer.model_copy(update={"used": 80, "time": world.clock() - timedelta(seconds=1)})
    calls = newer.model_copy(update={"resource": Resource.API_CALLS, "used": 3})
    saved: list[QuotaState] = []
    save = world.store.save_quota_state

    async def counted(state: QuotaState) -> None:
        saved.append(state)
        await save(state)

    world.store.save_quota_state = counted  # type: ignore[method-assign]
    await world.service.save_quota_states([newer, calls, older])  # a batch gathered in any order
    assert sorted(s.used for s in saved) == [3, 85]  # the older state is not written at all
    assert world.store.quota_states[(account, Resource.AI_TOKENS)]["used"] == 85
    await world.service.save_quota_states([])  # an empty batch (key states only) writes nothing
    assert len(saved) == 2


async def test_a_rule_whose_threshold_is_passed_this_period_fires_at_creation(world):
    account = uuid.uuid4()
    state = QuotaState(
        time=world.clock(), account_id=account, resource=Resource.AI_TOKENS, period="2026-11", total=100, used=85, blocked=False
    )
    await world.service.save_quota_state(state)
    await world.service.save_quota_state(state.model_copy(update={"used": 1, "time": datetime(2026, 11, 1, tzinfo=UTC)}))  # older
    created = await world.service.create_rule(account, rule(80), audit=ACTOR)
    assert created.fired_this_period and len(world.deliver.submitted) == 1
    assert [f["cause"] for f in world.store.firings.values()] == ["creation"]
    await world.service.create_rule(account, rule(90), audit=ACTOR)  # 85% < 90%: not yet
    assert len(world.deliver.submitted) == 1
    # A flow's usage of an earlier period does not fire a rule created in the next one.
    world.clock.now = datetime(2026, 12, 2, tzinfo=UTC)
    await world.service.create_rule(account, rule(50), audit=ACTOR)
    assert len(world.deliver.submitted) == 1


async def test_rule_crud_and_another_accounts_rule_is_not_found(world):
    account, other = uuid.uuid4(), uuid.uuid4()
    mine = await world.service.create_rule(
        account, rule(80, [Channel.EMAIL], [EmailRecipient(email="ops@example.com")]), audit=ACTOR
    )
    assert mine.webhook_secret is None and mine.failed_deliveries == 0
    hooked = await world.service.create_rule(
        account, rule(90, [Channel.WEBHOOK], [WebhookRecipient(url="https://hooks.example.com/x")]), audit=ACTOR
    )
    assert hooked.webhook_secret
    assert [r.id for r in (await world.service.list_rules(account)).rules] == [mine.id, hooked.id]
    assert (await world.service.list_rules(other)).rules == []

    with pytest.raises(NotFound):
        await world.service.delete_rule(other, mine.id, audit=ACTOR)
    with pytest.raises(NotFound):
        await world.service.deliveries(other, mine.id)
    assert (await world.service.deliveries(account, mine.id)).items == []
    await world.service.delete_rule(account, mine.id, audit=ACTOR)
    with pytest.raises(NotFound):
        await world.service.delete_rule(account, mine.id, audit=ACTOR)
    assert [r.id for r in (await world.service.list_rules(account)).rules] == [hooked.id]

    with pytest.raises(Invalid) as invalid:  # email without an {email} recipient
        await world.service.create_rule(account, rule(80, [Channel.EMAIL]), audit=ACTOR)
    assert invalid.value.details


def user_state(account: uuid.UUID, user: uuid.UUID, *, removed: bool = False, minutes: int = 0) -> UserState:
    return UserState(
        time=datetime(2026, 11, 15, 12, minutes, tzinfo=UTC), account_id=account, user_id=user, role=Role.VIEWER, removed=removed
    )


async def test_a_member_is_a_recipient_and_the_accounts_inbox_gets_one_notice_per_firing(world):
    account, member = uuid.uuid4(), uuid.uuid4()
    await world.service.save_user(user_state(account, member))  # from users.v1
    users = [UserRecipient(user_id=account), UserRecipient(user_id=member)]
    created = await world.service.create_rule(account, rule(80, [Channel.IN_SITE], users), audit=ACTOR)
    assert created.recipients == users
    await world.service.fire_crossing(crossed(account, 85))
    assert [(world.store.deliveries[i]["channel"], world.store.deliveries[i]["recipient"]) for i in world.deliver.submitted] == [
        (Channel.IN_SITE, f"account:{account}")
    ]


async def test_a_user_id_unknown_removed_or_of_another_account_is_invalid_alike(world):
    account, stranger = uuid.uuid4(), uuid.uuid4()
    strangers_member, removed = uuid.uuid4(), uuid.uuid4()
    await world.service.save_user(user_state(stranger, strangers_member))
    await world.service.save_user(user_state(account, removed, removed=True, minutes=5))
    await world.service.save_user(user_state(account, removed, minutes=1))  # an older state, late: still removed
    for user in (uuid.uuid4(), strangers_member, removed, stranger):
        with pytest.raises(Invalid) as invalid:
            await world.service.create_rule(account, rule(80, [Channel.IN_SITE], [UserRecipient(user_id=user)]), audit=ACTOR)
        assert invalid.value.details == [
            {"field": "recipients.0.user_id", "message": "The user is not a user of this account.", "type": "value_error"}
        ]
    assert world.store.rules == {} and world.store.outbox == []  # nothing made, nothing audited


async def test_a_refused_webhook_target_is_invalid():
    async def refuse(url: str, *, https_only: bool) -> str | None:
        return "a private address"

    world = AlertsWorld(NOW, check_target=refuse)
    with pytest.raises(Invalid) as invalid:
        await world.service.create_rule(
            uuid.uuid4(), rule(80, [Channel.WEBHOOK], [WebhookRecipient(url="http://10.0.0.1/")]), audit=ACTOR
        )
    assert invalid.value.details[0]["field"] == "recipients.0.url"
    assert world.store.rules == {}


async def test_fired_deliveries_are_logged_per_rule(world):
    account = uuid.uuid4()
    r80 = await world.service.create_rule(
        account, rule(80, [Channel.IN_SITE, Channel.EMAIL], [EmailRecipient(email="a@example.com")]), audit=ACTOR
    )
    await world.service.fire_crossing(crossed(account, 81))
    log = (await world.service.deliveries(account, r80.id)).items
    assert sorted(d.channel.value for d in log) == ["email", "in_site"] and {d.attempt for d in log} == {0}


async def test_the_inbox_lists_newest_first_and_marks_read_only_ones_own(world):
    account, other = uuid.uuid4(), uuid.uuid4()
    for day in (1, 2):
        nid = uuid.uuid4()
        world.store.notifications[nid] = {
            "id": nid,
            "account_id": account,
            "created_at": datetime(2026, 11, day, tzinfo=UTC),
            "title": f"n{day}",
            "message": "m",
            "metric": "total_tokens",
            "threshold_pct": 80,
            "links": {"upgrade_plan": "u", "buy_quota_package": "b"},
            "read_at": None,
        }
    listed = (await world.service.notifications(account, 50, unread_only=False)).items
    assert [n.title for n in listed] == ["n2", "n1"]
    assert (await world.service.notifications(other, 50, unread_only=False)).items == []
    with pytest.raises(NotFound):
        await world.service.mark_read(other, listed[0].id)
    assert (await world.service.mark_read(account, listed[0].id)).read
    assert [n.title for n in (await world.service.notifications(account, 50, unread_only=True)).items] == ["n1"]


def key_state(account: uuid.UUID, created_at: datetime | None, key_id: uuid.UUID | None = None, **kw) -> KeyState:
    return KeyState(
        time=datetime(2026, 11, 15, tzinfo=UTC),
        account_id=account,
        key_id=key_id or uuid.uuid4(),
        hash="a" * 64,
        status=KeyStatus.ENABLED,
        roles=[Role.OWNER],
        masked_key="sk-abcd...wxyz",
        created_at=created_at,
        **kw,
    )


async def test_a_key_older_than_90_days_gets_one_reminder_ever(world):
    account, other = uuid.uuid4(), uuid.uuid4()
    old = key_state(account, world.clock() - timedelta(days=91))
    await world.service.save_key(old)  # already old when it arrives: reminded at once
    await world.service.save_key(key_state(account, world.clock() - timedelta(days=89)))  # young
    await world.service.save_key(key_state(account, None))  # age unknown (an older publisher): never
    gone = key_state(account, world.clock() - timedelta(days=200), deleted=True)
    await world.service.save_key(gone)
    items = (await world.service.notifications(account, 50, unread_only=False)).items
    assert [(n.kind, n.api_key_id, n.metric, n.threshold_pct, n.links) for n in items] == [
        ("key_rotation_due", old.key_id, None, None, {})
    ]
    assert items[0].title == "Rotate this key" and "sk-abcd...wxyz" in items[0].message
    assert (await world.service.notifications(other, 50, unread_only=False)).items == []

    await world.service.save_key(old)  # a replay
    assert await world.service.remind_rotations() == 0
    world.clock.advance(days=2)  # the young key ages past 90 days: the periodic pass reminds it
    assert await world.service.remind_rotations() == 1
    assert await world.service.remind_rotations() == 0
    assert len((await world.service.notifications(account, 50, unread_only=False)).items) == 2
