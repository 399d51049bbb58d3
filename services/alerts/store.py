"""The alerts service's Postgres adapter (schema `alerts`): ALL its SQL. The functions run in
the caller's transaction (the dispatcher holds one per send); the use cases (service.py) open
one through `AlertsStore.transaction()` and call the methods of the `AlertsTx` it yields."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from pydantic import TypeAdapter

from contracts.alerts_api import Channel, DeliveryStatus, Recipient
from contracts.common import METRIC_RESOURCE, AlertMetric, Resource
from contracts.events import KeyState, QuotaState, UserState
from contracts.key_limits import LimitPeriod
from contracts.topics import Topic
from services.alerts import domain
from services.runtime.platform.outbox_relay import OutboxRelay

Row = dict[str, Any]
# Any: the shared pool is not typed by row factory (it makes dict rows, see runtime.postgres).
Conn = AsyncConnection[Any]
_RECIPIENTS: TypeAdapter[list[Recipient]] = TypeAdapter(list[Recipient])


@dataclass(frozen=True)
class Rule:
    id: UUID
    account_id: UUID
    metric: AlertMetric
    threshold_pct: int
    channels: list[Channel]
    recipients: list[Recipient]
    created_at: datetime
    api_key_id: UUID | None = None  # (v4) the key whose own limit the rule watches; None: the account

    @property
    def resource(self) -> Resource:
        return METRIC_RESOURCE[self.metric]


def _rule(row: Row) -> Rule:
    return Rule(
        id=row["id"],
        account_id=row["account_id"],
        metric=AlertMetric(row["metric"]),
        threshold_pct=row["threshold_pct"],
        channels=[Channel(c) for c in row["channels"]],
        recipients=_RECIPIENTS.validate_python(row["recipients"]),
        created_at=row["created_at"],
        api_key_id=row.get("api_key_id"),
    )


# ---- rules ------------------------------------------------------------------------------------
async def insert_rule(
    conn: Conn,
    account_id: UUID,
    metric: AlertMetric,
    threshold_pct: int,
    channels: list[Channel],
    recipients: list[Recipient],
    created_at: datetime,
    webhook_secret: str | None = None,
    api_key_id: UUID | None = None,
) -> Rule:
    # The webhook secret is kept in plain: the server signs with it (it is never logged or returned).
    # created_at from the use case's clock: which periods the rule watches (record_crossing).
    cur = await conn.execute(
        """INSERT INTO alerts.rules
               (id, account_id, metric, resource, threshold_pct, channels, recipients, webhook_secret, api_key_id, created_at)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING *""",
        (
            uuid4(),
            account_id,
            metric.value,
            METRIC_RESOURCE[metric].value,
            threshold_pct,
            [c.value for c in channels],
            Jsonb(_RECIPIENTS.dump_python(recipients, mode="json")),
            webhook_secret,
            api_key_id,
            created_at,
        ),
    )
    row = await cur.fetchone()
    assert row is not None
    return _rule(row)


@dataclass(frozen=True)
class RuleView:
    rule: Rule
    fired_this_period: bool
    last_fired_at: datetime | None
    failed_deliveries: int


async def list_rules(conn: Conn, account_id: UUID, current_windows: list[str], rule_id: UUID | None = None) -> list[RuleView]:
    """`current_windows`: the windows that hold now (this month; (v4) today, this week, `once`): an
    account rule's firings are named by month only, a key rule's by its limit's window."""
    cur = await conn.execute(
        """SELECT r.*,
                  EXISTS (SELECT 1 FROM alerts.firings f WHERE f.rule_id = r.id AND f.period = ANY(%s))
                      AS fired_this_period,
                  (SELECT max(f.fired_at) FROM alerts.firings f WHERE f.rule_id = r.id) AS last_fired_at,
                  (SELECT count(*) FROM alerts.deliveries d JOIN alerts.firings f ON f.id = d.firing_id
                    WHERE f.rule_id = r.id AND d.status = 'failed') AS failed_deliveries
             FROM alerts.rules r WHERE r.account_id = %s AND (%s::uuid IS NULL OR r.id = %s)
            ORDER BY r.created_at, r.id""",
        (current_windows, account_id, rule_id, rule_id),
    )
    return [
        RuleView(_rule(row), row["fired_this_period"], row["last_fired_at"], int(row["failed_deliveries"]))
        for row in await cur.fetchall()
    ]


async def count_rules_locked(conn: Conn, account_id: UUID) -> int:
    """The account's rules, counted under a per-account lock held until the transaction ends, so
    two creations at once cannot both take the last place."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('alerts.rules:' || %s::text, 0))", (account_id,))
    cur = await conn.execute("SELECT count(*) AS n FROM alerts.rules WHERE account_id = %s", (account_id,))
    row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def delete_rule(conn: Conn, account_id: UUID, rule_id: UUID) -> bool:
    cur = await conn.execute("DELETE FROM alerts.rules WHERE id = %s AND account_id = %s", (rule_id, account_id))
    return cur.rowcount == 1


async def rule_exists(conn: Conn, account_id: UUID, rule_id: UUID) -> bool:
    cur = await conn.execute("SELECT 1 FROM alerts.rules WHERE id = %s AND account_id = %s", (rule_id, account_id))
    return await cur.fetchone() is not None


async def rules_for(
    conn: Conn, account_id: UUID, resource: Resource, max_threshold: int, api_key_id: UUID | None = None
) -> list[Rule]:
    """The rules a crossing reaches: the account's rules for an account crossing, (v4) the rules
    scoped to that key for a crossing of one key's limit; never the other kind."""
    cur = await conn.execute(
        """SELECT * FROM alerts.rules
            WHERE account_id = %s AND resource = %s AND threshold_pct <= %s AND api_key_id IS NOT DISTINCT FROM %s""",
        (account_id, resource.value, max_threshold, api_key_id),
    )
    return [_rule(row) for row in await cur.fetchall()]


# ---- quota states -----------------------------------------------------------------------------
async def save_quota_state(conn: Conn, state: QuotaState) -> None:
    """Keep the newest state per account and resource (a late or redelivered one changes nothing)."""
    await conn.execute(
        """INSERT INTO alerts.quota_states AS q (account_id, resource, period, total, used, time)
           VALUES (%s, %s, %s, %s, %s, %s)
           ON CONFLICT (account_id, resource) DO UPDATE
              SET period = excluded.period, total = excluded.total, used = excluded.used, time = excluded.time
            WHERE (excluded.period, excluded.time) >= (q.period, q.time)""",
        (state.account_id, state.resource.value, state.period, state.total, state.used, state.time),
    )


async def quota_state(conn: Conn, account_id: UUID, resource: Resource) -> Row | None:
    cur = await conn.execute(
        "SELECT period, total, used FROM alerts.quota_states WHERE account_id = %s AND resource = %s",
        (account_id, resource.value),
    )
    return await cur.fetchone()


# ---- firings and deliveries --------------------------------------------------------------------
@dataclass(frozen=True)
class Firing:
    rule: Rule
    period: str
    used: int
    total: int
    cause: str
    event_id: UUID | None = None
    limit_period: LimitPeriod | None = None  # (v4) a key rule's firing: the period of the limit crossed
    # The account's day of outside messages, locked (lock_outside_budget); None: not budgeted
    # (only tests that drive the store directly)
    budget: domain.OutsideBudget | None = None


async def record_firing(conn: Conn, firing: Firing) -> list[UUID]:
    """Insert the firing and its deliveries; returns the new delivery ids, or [] when this
    (rule, threshold, period) has fired already. Run inside the caller's transaction."""
    rule = firing.rule
    cur = await conn.execute(
        """INSERT INTO alerts.firings
               (id, rule_id, account_id, metric, threshold_pct, period, used, total, cause, event_id, api_key_id, limit_period)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
           ON CONFLICT ON CONSTRAINT firings_once DO NOTHING RETURNING id""",
        (
            uuid4(),
            rule.id,
            rule.account_id,
            rule.metric.value,
            rule.threshold_pct,
            firing.period,
            firing.used,
            firing.total,
            firing.cause,
            firing.event_id,
            rule.api_key_id,
            firing.limit_period.value if firing.limit_period else None,
        ),
    )
    row = await cur.fetchone()
    if row is None:
        return []
    planned = domain.plan_deliveries(rule.account_id, rule.channels, rule.recipients)
    held: list[domain.PlannedDelivery] = []
    if firing.budget is not None:
        planned, held = firing.budget.split(planned)
        await save_outside_budget(conn, rule.account_id, firing.budget)
    ids = [uuid4() for _ in planned]
    async with conn.cursor() as cursor:
        await cursor.executemany(
            "INSERT INTO alerts.deliveries (id, firing_id, channel, recipient) VALUES (%s, %s, %s, %s)",
            [(i, row["id"], p.channel.value, p.recipient) for i, p in zip(ids, planned, strict=True)],
        )
        if held:
            assert firing.budget is not None
            # final at once and never sent: the delivery log shows why (its `error`)
            await cursor.executemany(
                "INSERT INTO alerts.deliveries (id, firing_id, channel, recipient, status, last_error)"
                " VALUES (%s, %s, %s, %s, 'failed', %s)",
                [(uuid4(), row["id"], p.channel.value, p.recipient, firing.budget.reason()) for p in held],
            )
    return ids


async def lock_outside_budget(conn: Conn, account_id: UUID, day: str, per_day: int) -> domain.OutsideBudget:
    """The account's outside messages of `day`, its row locked until the transaction ends (an upsert:
    the first firing of the day creates it; a concurrent one waits for it and reads it committed)."""
    cur = await conn.execute(
        """INSERT INTO alerts.outside_messages AS b (account_id, day) VALUES (%s, %s)
           ON CONFLICT (account_id, day) DO UPDATE SET queued = b.queued
           RETURNING queued, suppressed""",
        (account_id, day),
    )
    row = await cur.fetchone()
    assert row is not None
    return domain.OutsideBudget(day, per_day, row["queued"], row["suppressed"])


async def save_outside_budget(conn: Conn, account_id: UUID, budget: domain.OutsideBudget) -> None:
    await conn.execute(
        "UPDATE alerts.outside_messages SET queued = %s, suppressed = %s WHERE account_id = %s AND day = %s",
        (budget.queued, budget.suppressed, account_id, budget.day),
    )


async def prune_outside_budgets(conn: Conn, before_day: str) -> int:
    """Forget the days no budget reads any more."""
    cur = await conn.execute("DELETE FROM alerts.outside_messages WHERE day < %s", (before_day,))
    return cur.rowcount


async def fired_rules(conn: Conn, rule_ids: list[UUID], period: str) -> set[UUID]:
    cur = await conn.execute("SELECT rule_id FROM alerts.firings WHERE rule_id = ANY(%s) AND period = %s", (rule_ids, period))
    return {row["rule_id"] for row in await cur.fetchall()}


@dataclass(frozen=True)
class PendingDelivery:
    id: UUID
    account_id: UUID
    channel: Channel
    recipient: str
    attempts: int
    metric: AlertMetric
    threshold_pct: int
    period: str
    used: int
    total: int
    rule_id: UUID
    created_at: datetime
    fired_at: datetime
    webhook_secret: str | None = field(default=None, repr=False)
    # (v4) a key rule's firing: the key (and its masked form, never the secret) and the limit's period
    api_key_id: UUID | None = None
    masked_key: str | None = None
    limit_period: LimitPeriod | None = None


async def lock_pending(conn: Conn, delivery_id: UUID, now: datetime) -> PendingDelivery | None:
    """Lock one pending delivery that is due for sending, or None if it is done, waits for a
    later attempt, or another sender has it. The lock lives as long as the caller's transaction."""
    cur = await conn.execute(
        """SELECT d.id, d.channel, d.recipient, d.attempts, d.created_at,
                  f.account_id, f.metric, f.threshold_pct, f.period, f.used, f.total, f.rule_id, f.fired_at,
                  r.webhook_secret, f.api_key_id, f.limit_period, k.masked_key
             FROM alerts.deliveries d JOIN alerts.firings f ON f.id = d.firing_id
             JOIN alerts.rules r ON r.id = f.rule_id
             LEFT JOIN alerts.keys k ON k.key_id = f.api_key_id
            WHERE d.id = %s AND d.status = 'pending' AND (d.next_attempt_at IS NULL OR d.next_attempt_at <= %s)
              FOR UPDATE OF d SKIP LOCKED""",
        (delivery_id, now),
    )
    row = await cur.fetchone()
    if row is None:
        return None
    return PendingDelivery(
        id=row["id"],
        account_id=row["account_id"],
        channel=Channel(row["channel"]),
        recipient=row["recipient"],
        attempts=row["attempts"],
        metric=AlertMetric(row["metric"]),
        threshold_pct=row["threshold_pct"],
        period=row["period"],
        used=row["used"],
        total=row["total"],
        rule_id=row["rule_id"],
        created_at=row["created_at"],
        fired_at=row["fired_at"],
        webhook_secret=row["webhook_secret"],
        api_key_id=row["api_key_id"],
        masked_key=row["masked_key"],
        limit_period=LimitPeriod(row["limit_period"]) if row["limit_period"] else None,
    )


async def finish_delivery(conn: Conn, delivery_id: UUID, status: DeliveryStatus, attempts: int, error: str | None) -> None:
    await conn.execute(
        """UPDATE alerts.deliveries
              SET status = %s, attempts = attempts + %s, last_error = %s,
                  sent_at = CASE WHEN %s = 'sent' THEN now() END, next_attempt_at = NULL
            WHERE id = %s""",
        (status.value, attempts, error, status.value, delivery_id),
    )


async def postpone_delivery(conn: Conn, delivery_id: UUID, error: str, next_attempt_at: datetime, attempts: int = 1) -> None:
    """`attempts` more failed attempts; the delivery stays pending until `next_attempt_at`."""
    await conn.execute(
        """UPDATE alerts.deliveries SET attempts = attempts + %s, last_error = %s, next_attempt_at = %s
            WHERE id = %s""",
        (attempts, error, next_attempt_at, delivery_id),
    )


@dataclass(frozen=True)
class Attempt:
    number: int
    time: datetime
    status_code: int | None = None
    error: str | None = None
    next_attempt_at: datetime | None = None


async def record_attempts(conn: Conn, delivery_id: UUID, attempts: list[Attempt]) -> None:
    async with conn.cursor() as cursor:
        await cursor.executemany(
            """INSERT INTO alerts.delivery_attempts (id, delivery_id, attempt, time, status_code, error, next_attempt_at)
               VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT ON CONSTRAINT delivery_attempts_once DO NOTHING""",
            [(uuid4(), delivery_id, a.number, a.time, a.status_code, a.error, a.next_attempt_at) for a in attempts],
        )


async def pending_ids(conn: Conn, now: datetime, limit: int = 500) -> list[UUID]:
    """Due pending deliveries no sender holds right now (a crashed sender's rows are free again)."""
    cur = await conn.execute(
        """SELECT id FROM alerts.deliveries
            WHERE status = 'pending' AND (next_attempt_at IS NULL OR next_attempt_at <= %s)
            ORDER BY created_at LIMIT %s FOR UPDATE SKIP LOCKED""",
        (now, limit),
    )
    return [row["id"] for row in await cur.fetchall()]


async def list_deliveries(conn: Conn, account_id: UUID, rule_id: UUID) -> list[Row]:
    """One row per attempt of every delivery of the rule; a delivery not tried yet is one row
    with attempt 0 (its creation time, and when it is due)."""
    cur = await conn.execute(
        """SELECT coalesce(a.id, d.id) AS id, coalesce(a.time, d.created_at) AS time, coalesce(a.attempt, 0) AS attempt,
                  a.status_code, CASE WHEN a.id IS NULL THEN d.last_error ELSE a.error END AS error,
                  CASE WHEN a.id IS NOT NULL THEN a.next_attempt_at
                       WHEN d.status = 'pending' THEN coalesce(d.next_attempt_at, d.created_at) END
                      AS next_attempt_at,
                  d.id AS delivery_id, d.firing_id, d.channel, d.recipient, d.status, d.attempts, d.last_error,
                  d.created_at, d.sent_at, f.period, f.threshold_pct
             FROM alerts.deliveries d JOIN alerts.firings f ON f.id = d.firing_id
             LEFT JOIN alerts.delivery_attempts a ON a.delivery_id = d.id
            WHERE f.rule_id = %s AND f.account_id = %s
            ORDER BY d.created_at, d.channel, d.recipient, a.attempt""",
        (rule_id, account_id),
    )
    return list(await cur.fetchall())


# ---- in-site notifications ----------------------------------------------------------------------
async def insert_notification(conn: Conn, delivery_id: UUID, account_id: UUID, message: domain.AlertMessage) -> None:
    await conn.execute(
        """INSERT INTO alerts.notifications
               (id, delivery_id, account_id, title, message, metric, threshold_pct, links, api_key_id)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (delivery_id) DO NOTHING""",
        (
            uuid4(),
            delivery_id,
            account_id,
            message.title,
            message.summary(),
            message.metric.value,
            message.threshold_pct,
            Jsonb({"upgrade_plan": message.links.upgrade_plan, "buy_quota_package": message.links.buy_quota_package}),
            message.api_key_id,
        ),
    )


async def list_notifications(conn: Conn, account_id: UUID, limit: int, unread_only: bool) -> list[Row]:
    cur = await conn.execute(
        """SELECT * FROM alerts.notifications WHERE account_id = %s AND (NOT %s OR read_at IS NULL)
            ORDER BY created_at DESC, id LIMIT %s""",
        (account_id, unread_only, limit),
    )
    return list(await cur.fetchall())


async def mark_read(conn: Conn, account_id: UUID, notification_id: UUID) -> Row | None:
    cur = await conn.execute(
        """UPDATE alerts.notifications SET read_at = coalesce(read_at, now())
            WHERE id = %s AND account_id = %s RETURNING *""",
        (notification_id, account_id),
    )
    return await cur.fetchone()


# ---- API keys' ages: the rotation reminder (v2) ---------------------------------------------------
async def save_key(conn: Conn, state: KeyState) -> None:
    """Keep each key's age from keys.v1 (the newest state wins; a deleted key stays deleted)."""
    await conn.execute(
        """INSERT INTO alerts.keys AS k (key_id, account_id, created_at, created_by, masked_key, deleted, time)
           VALUES (%s, %s, %s, %s, %s, %s, %s)
           ON CONFLICT (key_id) DO UPDATE
              SET created_at = coalesce(excluded.created_at, k.created_at),
                  created_by = coalesce(excluded.created_by, k.created_by),
                  masked_key = coalesce(excluded.masked_key, k.masked_key),
                  deleted = k.deleted OR excluded.deleted,
                  time = greatest(k.time, excluded.time)""",
        (state.key_id, state.account_id, state.created_at, state.created_by, state.masked_key, state.deleted, state.time),
    )


async def is_account_key(conn: Conn, account_id: UUID, key_id: UUID) -> bool:
    """(v4) Whether `key_id` is a live key of the account, as keys.v1 last said."""
    cur = await conn.execute(
        "SELECT 1 FROM alerts.keys WHERE key_id = %s AND account_id = %s AND NOT deleted", (key_id, account_id)
    )
    return await cur.fetchone() is not None


# ---- the accounts' users (members, v2): a rule's `{user_id}` recipients -------------------------
async def save_user(conn: Conn, state: UserState) -> None:
    """Keep each user's account from users.v1; a removal is final (an older state does not undo it)."""
    await conn.execute(
        """INSERT INTO alerts.users AS u (user_id, account_id, removed, time) VALUES (%s, %s, %s, %s)
           ON CONFLICT (user_id) DO UPDATE
              SET removed = u.removed OR excluded.removed, time = greatest(u.time, excluded.time)""",
        (state.user_id, state.account_id, state.removed, state.time),
    )


async def account_users(conn: Conn, account_id: UUID, user_ids: list[UUID]) -> set[UUID]:
    """Those of `user_ids` that are live users of the account, as users.v1 last said."""
    cur = await conn.execute(
        "SELECT user_id FROM alerts.users WHERE user_id = ANY(%s) AND account_id = %s AND NOT removed",
        (user_ids, account_id),
    )
    return {row["user_id"] for row in await cur.fetchall()}


async def keys_unreminded(conn: Conn, created_before: datetime, limit: int, key_id: UUID | None = None) -> list[Row]:
    """Live keys made before `created_before` that have no rotation reminder yet (one, by id)."""
    cur = await conn.execute(
        """SELECT k.key_id, k.account_id, k.created_at, k.created_by, k.masked_key FROM alerts.keys k
            WHERE NOT k.deleted AND k.created_at < %s AND (%s::uuid IS NULL OR k.key_id = %s)
              AND NOT EXISTS (SELECT 1 FROM alerts.notifications n
                               WHERE n.kind = 'key_rotation_due' AND n.api_key_id = k.key_id)
            ORDER BY k.created_at LIMIT %s""",
        (created_before, key_id, key_id, limit),
    )
    return list(await cur.fetchall())


async def add_rotation_notification(
    conn: Conn, key_id: UUID, account_id: UUID, created_by: UUID | None, title: str, message: str, now: datetime
) -> bool:
    """The key's one reminder; False when it exists already (another replica, a replay)."""
    cur = await conn.execute(
        """INSERT INTO alerts.notifications
               (id, delivery_id, account_id, created_at, title, message, metric, threshold_pct, links, kind, api_key_id,
                created_by)
           VALUES (%s, NULL, %s, %s, %s, %s, NULL, NULL, '{}', 'key_rotation_due', %s, %s)
           ON CONFLICT (api_key_id) WHERE kind = 'key_rotation_due' DO NOTHING""",
        (uuid4(), account_id, now, title, message, key_id, created_by),
    )
    return cur.rowcount == 1


# ---- the use cases' port -------------------------------------------------------------------------
class AlertsStore:
    def __init__(self, pool: AsyncConnectionPool, relay: OutboxRelay) -> None:
        self._pool = pool
        self._relay = relay

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator["AlertsTx"]:
        async with self._pool.connection() as conn, conn.transaction():
            yield AlertsTx(conn, self._relay)


class AlertsTx:
    """The statements of one transaction, as the use cases call them."""

    def __init__(self, conn: Conn, relay: OutboxRelay) -> None:
        self.conn = conn
        self._relay = relay

    async def publish(self, topic: Topic, key: bytes, value: bytes) -> None:
        """An outbox row in this transaction (the relay sends it after the commit)."""
        await self._relay.add(self.conn, topic, key, value)

    async def insert_rule(
        self,
        account_id: UUID,
        metric: AlertMetric,
        threshold_pct: int,
        channels: list[Channel],
        recipients: list[Recipient],
        created_at: datetime,
        webhook_secret: str | None = None,
        api_key_id: UUID | None = None,
    ) -> Rule:
        return await insert_rule(
            self.conn, account_id, metric, threshold_pct, channels, recipients, created_at, webhook_secret, api_key_id
        )

    async def list_rules(self, account_id: UUID, current_windows: list[str], rule_id: UUID | None = None) -> list[RuleView]:
        return await list_rules(self.conn, account_id, current_windows, rule_id)

    async def count_rules_locked(self, account_id: UUID) -> int:
        return await count_rules_locked(self.conn, account_id)

    async def delete_rule(self, account_id: UUID, rule_id: UUID) -> bool:
        return await delete_rule(self.conn, account_id, rule_id)

    async def rule_exists(self, account_id: UUID, rule_id: UUID) -> bool:
        return await rule_exists(self.conn, account_id, rule_id)

    async def rules_for(
        self, account_id: UUID, resource: Resource, max_threshold: int, api_key_id: UUID | None = None
    ) -> list[Rule]:
        return await rules_for(self.conn, account_id, resource, max_threshold, api_key_id)

    async def save_quota_state(self, state: QuotaState) -> None:
        await save_quota_state(self.conn, state)

    async def quota_state(self, account_id: UUID, resource: Resource) -> Row | None:
        return await quota_state(self.conn, account_id, resource)

    async def record_firing(self, firing: Firing) -> list[UUID]:
        return await record_firing(self.conn, firing)

    async def fired_rules(self, rule_ids: list[UUID], period: str) -> set[UUID]:
        return await fired_rules(self.conn, rule_ids, period)

    async def lock_outside_budget(self, account_id: UUID, day: str, per_day: int) -> domain.OutsideBudget:
        return await lock_outside_budget(self.conn, account_id, day, per_day)

    async def prune_outside_budgets(self, before_day: str) -> int:
        return await prune_outside_budgets(self.conn, before_day)

    async def list_deliveries(self, account_id: UUID, rule_id: UUID) -> list[Row]:
        return await list_deliveries(self.conn, account_id, rule_id)

    async def list_notifications(self, account_id: UUID, limit: int, unread_only: bool) -> list[Row]:
        return await list_notifications(self.conn, account_id, limit, unread_only)

    async def mark_read(self, account_id: UUID, notification_id: UUID) -> Row | None:
        return await mark_read(self.conn, account_id, notification_id)

    async def save_key(self, state: KeyState) -> None:
        await save_key(self.conn, state)

    async def is_account_key(self, account_id: UUID, key_id: UUID) -> bool:
        return await is_account_key(self.conn, account_id, key_id)

    async def save_user(self, state: UserState) -> None:
        await save_user(self.conn, state)

    async def account_users(self, account_id: UUID, user_ids: list[UUID]) -> set[UUID]:
        return await account_users(self.conn, account_id, user_ids)

    async def keys_unreminded(self, created_before: datetime, limit: int, key_id: UUID | None = None) -> list[Row]:
        return await keys_unreminded(self.conn, created_before, limit, key_id)

    async def add_rotation_notification(
        self, key_id: UUID, account_id: UUID, created_by: UUID | None, title: str, message: str, now: datetime
    ) -> bool:
        return await add_rotation_notification(self.conn, key_id, account_id, created_by, title, message, now)
