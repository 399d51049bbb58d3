"""The alerts service's use cases: rules (create, list, delete, delivery log), firing a quota
crossing, keeping the latest quota states, the in-site inbox. Each runs in one transaction of the
store; the deliveries a firing records are handed to `deliver` (the dispatcher) after the commit:
a crash from there on leaves them pending for the dispatcher's sweep."""

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict
from datetime import timedelta
from typing import Any, Protocol
from uuid import UUID
from zoneinfo import ZoneInfo

from prometheus_client import Counter

from contracts.alerts_api import (
    Channel,
    DeliveryList,
    DeliveryOut,
    NotificationList,
    NotificationOut,
    RuleCreated,
    RuleIn,
    RuleList,
    RuleOut,
    RuleScope,
    WebhookRecipient,
)
from contracts.audit import AuditAction, AuditContext
from contracts.clock import Clock
from contracts.common import Resource
from contracts.credentials import ROTATION_AGE, rotation_due
from contracts.domain_errors import Invalid, NotFound
from contracts.events import KeyState, QuotaState, QuotaThresholdCrossed, UserState
from contracts.key_limits import LimitPeriod, window_of
from contracts.period import period_of
from contracts.topics import AUDIT
from services.alerts import domain, webhook
from services.alerts.store import AlertsStore, AlertsTx, Firing, Row, RuleView


class TargetCheck(Protocol):
    """Why a `{url}` may not be a rule's target (webhook.creation_refusal), or None."""

    def __call__(self, url: str, *, https_only: bool) -> Awaitable[str | None]: ...


Deliver = Callable[[Iterable[UUID]], None]

log = logging.getLogger(__name__)

HELD_BACK = Counter(
    "tollgate_alerts_held_back_total",
    "Alert deliveries not sent because the account reached its daily limit of outside messages "
    "(ALERTS_OUTSIDE_MESSAGES_PER_DAY), by channel (unit: deliveries)",
    ["channel"],
)
for _channel in domain.OUTSIDE_CHANNELS:  # on /metrics at 0 from the start
    HELD_BACK.labels(_channel.value)


async def record_crossing(
    tx: AlertsTx, event: QuotaThresholdCrossed, tz: ZoneInfo, budget: "BudgetOf | None" = None
) -> list[UUID]:
    """Record a firing (and its deliveries) for every rule the crossing reaches that has not fired
    this period; returns the new delivery ids. The unique constraint settles any race.
    (v4) A crossing of one key's limit reaches only the rules scoped to that key, and fires once
    per (rule, threshold, window of the limit): a daily limit may fire again tomorrow.
    A rule made after the crossing's month is not reached: a late or replayed crossing of a month
    that was over before the rule existed would announce a period the rule never watched."""
    reached = await tx.rules_for(event.account_id, event.resource, event.threshold_pct, event.api_key_id)
    rules = [r for r in reached if period_of(r.created_at, tz) <= event.period]
    if not rules:
        return []
    # A key crossing without its window (not one quota publishes) counts in the month it names.
    period = (event.window or event.period) if event.api_key_id else event.period
    by_id = {r.id: r for r in rules}
    already = await tx.fired_rules(list(by_id), period)
    due = domain.rules_to_fire((domain.RuleThreshold(r.id, r.threshold_pct) for r in rules), event.threshold_pct, already)
    # The budget's row is locked before any firing row is written, as at a rule's creation: one
    # lock order for every transaction of the account.
    outside = await budget(tx, event.account_id) if budget is not None and due else None
    delivery_ids: list[UUID] = []
    for item in due:
        delivery_ids += await tx.record_firing(
            Firing(by_id[item.rule_id], period, event.used, event.total, "crossing", event.id, event.limit_period, outside)
        )
    return delivery_ids


BudgetOf = Callable[[AlertsTx, UUID], Awaitable[domain.OutsideBudget]]


def report_held_back(account_id: UUID, budget: domain.OutsideBudget) -> None:
    """The metric for every message held back; one log line per account and day (the first).
    Called after the commit: a rolled-back transaction held nothing back."""
    for channel in budget.held_back:
        HELD_BACK.labels(channel.value).inc()
    if budget.first_reached:
        log.warning(
            "alerts: account %s reached its daily limit of %d outside alert messages on %s; further e-mail, SMS, "
            "webhook, Slack and Teams alerts are not sent until the next day (in-site ones are)",
            account_id,
            budget.per_day,
            budget.day,
        )


def _rule_out(view: RuleView) -> RuleOut:
    rule = view.rule
    return RuleOut(
        id=rule.id,
        metric=rule.metric,
        threshold_pct=rule.threshold_pct,
        channels=rule.channels,
        recipients=domain.shown_recipients(rule.channels, rule.recipients),
        scope=RuleScope(api_key_id=rule.api_key_id) if rule.api_key_id else None,
        created_at=rule.created_at,
        fired_this_period=view.fired_this_period,
        last_fired_at=view.last_fired_at,
        failed_deliveries=view.failed_deliveries,
    )


def _notification_out(row: Row) -> NotificationOut:
    return NotificationOut(
        id=row["id"],
        created_at=row["created_at"],
        title=row["title"],
        message=row["message"],
        metric=row["metric"],
        threshold_pct=row["threshold_pct"],
        links=row["links"],
        read=row["read_at"] is not None,
        kind=row.get("kind") or "quota_threshold",
        api_key_id=row.get("api_key_id"),
    )


class AlertsService:
    def __init__(
        self,
        store: AlertsStore,
        clock: Clock,
        tz: ZoneInfo,
        check_target: TargetCheck,
        deliver: Deliver,
        *,
        outside_messages_per_day: int = 50,
        max_rules: int = 50,
    ) -> None:
        self._store = store
        self._clock = clock
        self._tz = tz
        self._check_target = check_target
        self._deliver = deliver
        self._outside_per_day = outside_messages_per_day
        self._max_rules = max_rules

    def _today(self) -> str:
        return self._clock().astimezone(self._tz).date().isoformat()

    async def _outside_budget(self, tx: AlertsTx, account_id: UUID) -> domain.OutsideBudget:
        """The account's outside messages of today, locked for this transaction."""
        return await tx.lock_outside_budget(account_id, self._today(), self._outside_per_day)

    def _period(self) -> str:
        return period_of(self._clock(), self._tz)

    def _current_windows(self) -> list[str]:
        """The windows that hold now: this month (an account rule's period) and (v4) today, this
        ISO week and `once` (a key rule's limit's window)."""
        now = self._clock()
        return sorted({self._period(), *(window_of(p, now, self._tz)[0] for p in LimitPeriod)})

    # ---- rules ---------------------------------------------------------------------------------
    async def create_rule(self, account_id: UUID, body: RuleIn, *, audit: AuditContext) -> RuleCreated:
        """A new rule; one whose threshold is already passed this period fires once, now."""
        problems = domain.validate_rule(body.channels, body.recipients)
        if not problems:
            problems = await self._webhook_problems(body)
        if problems:
            raise Invalid("The rule is not valid.", details=[asdict(p) for p in problems])
        secret = webhook.new_secret() if Channel.WEBHOOK in body.channels else None
        period = self._period()
        key_id = body.scope.api_key_id if body.scope else None
        async with self._store.transaction() as tx:
            if await tx.count_rules_locked(account_id) >= self._max_rules:
                raise Invalid(
                    f"The account has {self._max_rules} alert rules, the most it may have: delete one first.",
                    details=[asdict(domain.Problem("rules", f"At most {self._max_rules} alert rules per account.", "too_many"))],
                )
            # The references in the body, a recipient's user_id and the scope's key: one that is not a
            # live user or key of this account (unknown, removed or deleted, another account's) is
            # 422, the same for all three (as alerts learnt them from users.v1 and keys.v1).
            user_ids = domain.user_ids_to_check(account_id, body.recipients)
            members = await tx.account_users(account_id, user_ids) if user_ids else set()
            problems = domain.unknown_users(account_id, body.recipients, members)
            if key_id is not None and not await tx.is_account_key(account_id, key_id):
                problems.append(domain.Problem("scope.api_key_id", "The key is not a key of this account."))
            if problems:
                raise Invalid("The rule is not valid.", details=[asdict(p) for p in problems])
            rule = await tx.insert_rule(
                account_id, body.metric, body.threshold_pct, body.channels, body.recipients, self._clock(), secret, key_id
            )
            delivery_ids: list[UUID] = []
            budget: domain.OutsideBudget | None = None
            # An account rule already passed fires now; a key rule waits for its key's next crossing
            # (alerts keeps no per-key standing: quota.v1's key states are the edge's).
            state = None if key_id else await tx.quota_state(account_id, Resource(rule.resource))
            if state is not None and domain.fires_at_creation(
                rule.threshold_pct, rule.resource, state["period"], state["used"], state["total"], period
            ):
                # Firing at creation is what a create/delete loop repeats: the day's budget bounds it.
                budget = await self._outside_budget(tx, account_id)
                delivery_ids = await tx.record_firing(
                    Firing(rule, period, state["used"], state["total"], "creation", budget=budget)
                )
            views = await tx.list_rules(account_id, self._current_windows(), rule_id=rule.id)
            details = {
                "metric": rule.metric.value,
                "threshold_pct": rule.threshold_pct,
                "channels": [c.value for c in rule.channels],
                **({"api_key_id": str(key_id)} if key_id else {}),
            }
            await self._audit(tx, audit, account_id, AuditAction.ALERT_RULE_CREATED, rule.id, details)
        if budget is not None:
            report_held_back(account_id, budget)
        self._deliver(delivery_ids)
        return RuleCreated(**_rule_out(views[0]).model_dump(), webhook_secret=secret)

    async def _webhook_problems(self, body: RuleIn) -> list[domain.Problem]:
        # Slack and Teams only ever give https URLs; plain http is a local test receiver's.
        https_only = not domain.CHAT_CHANNELS.isdisjoint(body.channels)
        problems: list[domain.Problem] = []
        for index, recipient in enumerate(body.recipients):
            if isinstance(recipient, WebhookRecipient):
                reason = await self._check_target(recipient.url, https_only=https_only)
                if reason is not None:
                    problems.append(domain.Problem(f"recipients.{index}.url", f"The URL may not be a webhook target: {reason}."))
        return problems

    async def list_rules(self, account_id: UUID) -> RuleList:
        async with self._store.transaction() as tx:
            views = await tx.list_rules(account_id, self._current_windows())
        return RuleList(rules=[_rule_out(v) for v in views])

    async def delete_rule(self, account_id: UUID, rule_id: UUID, *, audit: AuditContext) -> None:
        async with self._store.transaction() as tx:
            if not await tx.delete_rule(account_id, rule_id):
                raise NotFound("alert rule")
            await self._audit(tx, audit, account_id, AuditAction.ALERT_RULE_DELETED, rule_id, {})

    async def _audit(
        self, tx: AlertsTx, audit: AuditContext, account_id: UUID, action: AuditAction, rule_id: UUID, details: dict[str, Any]
    ) -> None:
        """The write's audit.v1 entry, in its transaction (the keys service stores it)."""
        entry = audit.entry(account_id, self._clock(), action, "alert_rule", rule_id, **details)
        await tx.publish(AUDIT, str(account_id).encode(), entry.model_dump_json().encode())

    async def deliveries(self, account_id: UUID, rule_id: UUID) -> DeliveryList:
        """The rule's delivery log (another account's rule: NotFound)."""
        async with self._store.transaction() as tx:
            if not await tx.rule_exists(account_id, rule_id):
                raise NotFound("alert rule")
            rows = await tx.list_deliveries(account_id, rule_id)
        return DeliveryList(
            items=[
                DeliveryOut.model_validate(
                    {**r, "recipient": domain.shown_delivery_recipient(Channel(r["channel"]), r["recipient"])}
                )
                for r in rows
            ]
        )

    # ---- from quota ----------------------------------------------------------------------------
    async def fire_crossing(self, event: QuotaThresholdCrossed) -> None:
        taken: list[domain.OutsideBudget] = []

        async def budget(tx: AlertsTx, account_id: UUID) -> domain.OutsideBudget:
            taken.append(await self._outside_budget(tx, account_id))
            return taken[-1]

        async with self._store.transaction() as tx:
            delivery_ids = await record_crossing(tx, event, self._tz, budget)
        for outside in taken:  # after the commit, like the deliveries
            report_held_back(event.account_id, outside)
        self._deliver(delivery_ids)

    async def save_quota_state(self, state: QuotaState) -> None:
        """Keep the newest state per account and resource (for rules created later)."""
        await self.save_quota_states([state])

    async def save_quota_states(self, states: list[QuotaState]) -> None:
        """A batch of states in one transaction: the newest of each account and resource."""
        newest: dict[tuple[UUID, Resource], QuotaState] = {}
        for state in states:
            current = newest.get((state.account_id, state.resource))
            if current is None or (state.period, state.time) >= (current.period, current.time):
                newest[(state.account_id, state.resource)] = state
        if not newest:
            return
        async with self._store.transaction() as tx:
            for state in newest.values():
                await tx.save_quota_state(state)

    # ---- the accounts' users (members, v2) --------------------------------------------------------
    async def save_user(self, state: UserState) -> None:
        """A user's state from users.v1: which account it belongs to, whether removed (a rule's
        `{user_id}` recipient must be a live user of the rule's account)."""
        async with self._store.transaction() as tx:
            await tx.save_user(state)

    # ---- the rotation reminder (v2) ---------------------------------------------------------------
    async def save_key(self, state: KeyState) -> None:
        """A key's state from keys.v1: keep its age; a key already older than 90 days gets its
        reminder at once (the periodic pass finds those that age later)."""
        async with self._store.transaction() as tx:
            await tx.save_key(state)
            if not state.deleted:
                await self._remind(tx, key_id=state.key_id)

    async def remind_rotations(self) -> int:
        """One pass: the in-site reminder for every live key older than 90 days that has none yet,
        once per key ever (a unique row: replicas and replays insert nothing more); returns how many."""
        async with self._store.transaction() as tx:
            return await self._remind(tx)

    async def _remind(self, tx: AlertsTx, key_id: UUID | None = None, limit: int = 500) -> int:
        now = self._clock()
        posted = 0
        for key in await tx.keys_unreminded(now - ROTATION_AGE, limit, key_id):
            if rotation_due(key["created_at"], now) and await tx.add_rotation_notification(
                key["key_id"],
                key["account_id"],
                key["created_by"],
                domain.ROTATION_TITLE,
                domain.rotation_message(key["masked_key"]),
                now,
            ):
                posted += 1
        return posted

    # ---- the outside-message budget ------------------------------------------------------------
    async def forget_old_budgets(self) -> int:
        """Delete the budget rows of days before yesterday (today's and yesterday's are kept for
        an operator's look); returns how many."""
        before = (self._clock().astimezone(self._tz).date() - timedelta(days=1)).isoformat()
        async with self._store.transaction() as tx:
            return await tx.prune_outside_budgets(before)

    # ---- the in-site inbox -----------------------------------------------------------------------
    async def notifications(self, account_id: UUID, limit: int, unread_only: bool) -> NotificationList:
        async with self._store.transaction() as tx:
            rows = await tx.list_notifications(account_id, limit, unread_only)
        return NotificationList(items=[_notification_out(r) for r in rows])

    async def mark_read(self, account_id: UUID, notification_id: UUID) -> NotificationOut:
        async with self._store.transaction() as tx:
            row = await tx.mark_read(account_id, notification_id)
        if row is None:
            raise NotFound("notification")
        return _notification_out(row)
