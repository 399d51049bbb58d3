"""Routes of the alerts service (API.md, "Alerts"); extensions say so in their descriptions."""

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Response

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
    WebhookRecipient,
)
from contracts.common import Permission
from contracts.errors import ErrorCode
from contracts.period import period_of
from services.alerts import domain, firing, store, webhook
from services.alerts.dispatcher import Dispatcher
from services.edge.component import Runtime
from services.edge.errors import ApiError, not_found
from services.edge.principal import Principal

RULE_DESCRIPTION = """Create an alert rule. A rule fires once per (rule, threshold, period), immediately when
usage crosses its threshold, on every channel it names; a rule whose threshold is already passed this period
fires once at creation.

Channels and recipients must fit each other (otherwise 422 `validation_error` with `details`):
`email` needs an `{email}` recipient and `sms` a `{phone}` recipient (E.164), and each such recipient needs its
channel; `in_site` needs no recipient: it goes to the account's inbox (`GET /api/notifications`). A `{user_id}`
recipient names that inbox's user, needs `in_site`, and must be the account's own id (an account has one user).

(v2) `webhook` needs a `{url}` recipient: http or https (else 422). A URL whose host resolves to a loopback,
private, link-local, unique-local, multicast or otherwise non-global address is 422 unless the operator set
`WEBHOOK_ALLOW_PRIVATE_TARGETS=true`; a name that does not resolve now is accepted (its deliveries fail and are
logged until it does). The address is checked again at every delivery, which connects only to the checked
address. The 201 carries `webhook_secret`, the rule's signing secret, this once: deliveries are POSTs of the alert
as JSON with `Tollgate-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "t.body">`, retried with backoff for 24 h on a
non-2xx answer or a connection error (see `.../{id}/deliveries`).

Extension: the response also carries `created_at` and `failed_deliveries`."""


def _rule_out(view: store.RuleView) -> RuleOut:
    rule = view.rule
    return RuleOut(
        id=rule.id,
        metric=rule.metric,
        threshold_pct=rule.threshold_pct,
        channels=rule.channels,
        recipients=rule.recipients,
        created_at=rule.created_at,
        fired_this_period=view.fired_this_period,
        last_fired_at=view.last_fired_at,
        failed_deliveries=view.failed_deliveries,
    )


def _notification_out(row: store.Row) -> NotificationOut:
    return NotificationOut(
        id=row["id"],
        created_at=row["created_at"],
        title=row["title"],
        message=row["message"],
        metric=row["metric"],
        threshold_pct=row["threshold_pct"],
        links=row["links"],
        read=row["read_at"] is not None,
    )


def build_router(runtime: Runtime, dispatcher: Dispatcher) -> APIRouter:
    pool, edge, tz = runtime.pool, runtime.edge, runtime.settings.tz
    allow_private = runtime.settings.webhook_allow_private_targets
    router = APIRouter(tags=["alerts"])
    can_read = Depends(edge.requires(Permission.ALERTS_READ))
    can_write = Depends(edge.requires(Permission.ALERTS_WRITE))

    @router.post("/api/ai/usage/alert", status_code=201, response_model=RuleCreated, description=RULE_DESCRIPTION)
    async def create_rule(body: RuleIn, principal: Principal = can_write) -> RuleCreated:
        problems = domain.validate_rule(principal.account_id, body.channels, body.recipients)
        if not problems:
            problems = await _webhook_problems(body)
        if problems:
            raise ApiError(422, ErrorCode.VALIDATION_ERROR, "The rule is not valid.", details=[asdict(p) for p in problems])
        secret = webhook.new_secret() if Channel.WEBHOOK in body.channels else None
        now = datetime.now(UTC)
        async with pool.connection() as conn, conn.transaction():
            rule = await store.insert_rule(
                conn, principal.account_id, body.metric, body.threshold_pct, body.channels, body.recipients, secret
            )
            delivery_ids = await firing.fire_at_creation(conn, rule, now, tz)
            views = await store.list_rules(conn, principal.account_id, period_of(now, tz), rule_id=rule.id)
        dispatcher.submit(delivery_ids)
        return RuleCreated(**_rule_out(views[0]).model_dump(), webhook_secret=secret)

    async def _webhook_problems(body: RuleIn) -> list[domain.Problem]:
        problems: list[domain.Problem] = []
        for index, recipient in enumerate(body.recipients):
            if isinstance(recipient, WebhookRecipient):
                reason = await webhook.creation_refusal(recipient.url, allow_private)
                if reason is not None:
                    problems.append(domain.Problem(f"recipients.{index}.url", f"The URL may not be a webhook target: {reason}."))
        return problems

    @router.get(
        "/api/ai/usage/alert",
        response_model=RuleList,
        description="The account's rules with `fired_this_period` (fired in the current period of the platform time "
        "zone) and `last_fired_at`. Extension: `created_at`, and `failed_deliveries` (messages that exhausted their "
        "retries; see `.../{id}/deliveries`).",
    )
    async def list_rules(principal: Principal = can_read) -> RuleList:
        async with pool.connection() as conn:
            views = await store.list_rules(conn, principal.account_id, period_of(datetime.now(UTC), tz))
        return RuleList(rules=[_rule_out(v) for v in views])

    @router.delete("/api/ai/usage/alert/{rule_id}", status_code=204, response_class=Response)
    async def delete_rule(rule_id: UUID, principal: Principal = can_write) -> Response:
        async with pool.connection() as conn, conn.transaction():
            if not await store.delete_rule(conn, principal.account_id, rule_id):
                raise not_found("alert rule")
        return Response(status_code=204)

    @router.get(
        "/api/ai/usage/alert/{rule_id}/deliveries",
        response_model=DeliveryList,
        description="(v2) The rule's delivery log: one item per attempt `{id, time, attempt, status_code, error, "
        "next_attempt_at}` of every message of its firings, oldest first (a message not tried yet: one item with "
        "`attempt` 0). `status_code` is the webhook receiver's answer; `next_attempt_at` is when the next attempt is "
        "due, null when none is. Extension: each item also names its message (`delivery_id`, `channel`, `recipient`, "
        "`status` pending/sent/failed, `attempts`, `last_error`). Another account's rule is 404.",
    )
    async def list_deliveries(rule_id: UUID, principal: Principal = can_read) -> DeliveryList:
        async with pool.connection() as conn:
            if not await store.rule_exists(conn, principal.account_id, rule_id):
                raise not_found("alert rule")
            rows = await store.list_deliveries(conn, principal.account_id, rule_id)
        return DeliveryList(items=[DeliveryOut.model_validate(r) for r in rows])

    @router.get(
        "/api/notifications",
        response_model=NotificationList,
        description="The account's in-site notifications, newest first. Extension: `limit` (default 50) and `unread_only`.",
    )
    async def list_notifications(
        principal: Principal = can_read,
        limit: Annotated[int, Query(ge=1, le=200)] = 50,
        unread_only: bool = False,
    ) -> NotificationList:
        async with pool.connection() as conn:
            rows = await store.list_notifications(conn, principal.account_id, limit, unread_only)
        return NotificationList(items=[_notification_out(r) for r in rows])

    @router.post(
        "/api/notifications/{notification_id}/read",
        response_model=NotificationOut,
        description="Extension: mark one notification read (idempotent); answers the notification. Needs only "
        "`alerts:read`: reading one's inbox is not changing alert rules.",
    )
    async def mark_read(notification_id: UUID, principal: Principal = can_read) -> NotificationOut:
        async with pool.connection() as conn, conn.transaction():
            row = await store.mark_read(conn, principal.account_id, notification_id)
        if row is None:
            raise not_found("notification")
        return _notification_out(row)

    return router
