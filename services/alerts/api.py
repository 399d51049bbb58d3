"""Routes of the alerts service (API.md, "Alerts"); extensions say so in their descriptions."""

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Request, Response

from contracts.alerts_api import DeliveryList, NotificationList, NotificationOut, RuleCreated, RuleIn, RuleList
from contracts.common import Permission
from services.alerts.service import AlertsService
from services.edge import Principal, Runtime

RULE_DESCRIPTION = """Create an alert rule. A rule fires once per (rule, threshold, period), immediately when
usage crosses its threshold, on every channel it names; a rule whose threshold is already passed this period
fires once at creation.

Channels and recipients must fit each other (otherwise 422 `validation_error` with `details`):
`email` needs an `{email}` recipient and `sms` a `{phone}` recipient (E.164), and each such recipient needs its
channel; `in_site` needs no recipient: it goes to the account's inbox (`GET /api/notifications`). A `{user_id}`
recipient names a user of the account (its own id, the registering user's, or a member's from
`GET /api/account/members`) and needs `in_site`; the inbox is the account's, read by all its users, so the rule
posts there once per firing however many users it names. A user id that is not a live user of the account
(unknown, removed, or another account's: the same answer for all) is 422 with `details[].field` =
`recipients.<i>.user_id`; a member added a moment ago is known within about a second (users.v1).

(v2) `webhook` needs a `{url}` recipient: http or https (else 422). A URL whose host resolves to a loopback,
private, link-local, unique-local, multicast or otherwise non-global address is 422 unless the operator set
`WEBHOOK_ALLOW_PRIVATE_TARGETS=true`; a name that does not resolve now is accepted (its deliveries fail and are
logged until it does). The address is checked again at every delivery, which connects only to the checked
address. The 201 carries `webhook_secret`, the rule's signing secret, this once: deliveries are POSTs of the alert
as JSON with `Tollgate-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "t.body">`, retried with backoff for 24 h on a
non-2xx answer or a connection error (see `.../{id}/deliveries`).

(v4) `slack` and `teams` need a `{url}` recipient: the Slack or Microsoft Teams channel's incoming-webhook URL,
https (plain http only with `WEBHOOK_ALLOW_PRIVATE_TARGETS=true`) and under the same address rule (else 422).
Each firing is posted in the platform's own format: Slack `{text, blocks}` (Block Kit header and mrkdwn sections
with the links; success is 200 with the body `ok`), Teams a message with one Adaptive Card 1.4 attachment
(`Action.OpenUrl` links; success is any 2xx). These posts are unsigned (neither platform checks a signature: the
URL is the credential) and have no `webhook_secret`; they are retried and logged like webhooks. A rule names at
most one of `webhook`, `slack` and `teams`: they share the `{url}` recipients.

An account holds at most 50 rules (operator setting `ALERTS_MAX_RULES_PER_ACCOUNT`): one more is 422
`validation_error` with `details[].field` = `rules`. The e-mail, SMS, webhook, Slack and Teams messages of an
account's alerts are limited per day (`ALERTS_OUTSIDE_MESSAGES_PER_DAY`, default 50); one past the limit is not sent
and shows in the rule's delivery log as `failed` with the reason in `error`. In-site notifications are never limited.

Extension: the response also carries `created_at` and `failed_deliveries`."""


def build_router(runtime: Runtime, service: AlertsService) -> APIRouter:
    edge = runtime.edge
    router = APIRouter(tags=["alerts"])
    can_read = Depends(edge.requires(Permission.ALERTS_READ))
    can_write = Depends(edge.requires(Permission.ALERTS_WRITE))

    @router.post("/api/ai/usage/alert", status_code=201, response_model=RuleCreated, description=RULE_DESCRIPTION)
    async def create_rule(body: RuleIn, request: Request, principal: Principal = can_write) -> RuleCreated:
        return await service.create_rule(principal.account_id, body, audit=edge.audit_context(request, principal))

    @router.get(
        "/api/ai/usage/alert",
        response_model=RuleList,
        description="The account's rules with `fired_this_period` (fired in the current period of the platform time "
        "zone) and `last_fired_at`. Extension: `created_at`, and `failed_deliveries` (messages that exhausted their "
        "retries or were held back by the daily limit of outside messages; see `.../{id}/deliveries`).",
    )
    async def list_rules(principal: Principal = can_read) -> RuleList:
        return await service.list_rules(principal.account_id)

    @router.delete("/api/ai/usage/alert/{rule_id}", status_code=204, response_class=Response)
    async def delete_rule(rule_id: UUID, request: Request, principal: Principal = can_write) -> Response:
        await service.delete_rule(principal.account_id, rule_id, audit=edge.audit_context(request, principal))
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
        return await service.deliveries(principal.account_id, rule_id)

    @router.get(
        "/api/notifications",
        response_model=NotificationList,
        description="The account's in-site notifications, newest first. (v2) Each item has a `kind`: `quota_threshold` "
        "(a rule's alert: `metric`, `threshold_pct`, links to upgrade or buy a package) or `key_rotation_due` (one "
        "reminder, ever, per API key older than 90 days: `api_key_id`, `metric` and `threshold_pct` null, `links` "
        "`{}`; a deleted key gets none). Extension: `limit` (default 50) and `unread_only`.",
    )
    async def list_notifications(
        principal: Principal = can_read,
        limit: Annotated[int, Query(ge=1, le=200)] = 50,
        unread_only: bool = False,
    ) -> NotificationList:
        return await service.notifications(principal.account_id, limit, unread_only)

    @router.post(
        "/api/notifications/{notification_id}/read",
        response_model=NotificationOut,
        description="Extension: mark one notification read (idempotent); answers the notification. Needs only "
        "`alerts:read`: reading one's inbox is not changing alert rules.",
    )
    async def mark_read(notification_id: UUID, principal: Principal = can_read) -> NotificationOut:
        return await service.mark_read(principal.account_id, notification_id)

    return router
