"""Wiring of the alerts service."""

import logging
from functools import partial
from pathlib import Path

from services.alerts import api, consumers, webhook
from services.alerts.channels import EmailChannel, InSiteChannel, SmsChannel
from services.alerts.dispatcher import Dispatcher
from services.alerts.service import AlertsService
from services.alerts.store import AlertsStore
from services.alerts.webhook import Backoff, WebhookSender
from services.edge import Component, Runtime
from services.runtime.platform.outbox_relay import OutboxRelay
from services.runtime.platform.periodic import Periodic

log = logging.getLogger(__name__)


def build(runtime: Runtime) -> Component:
    settings = runtime.settings
    sms = SmsChannel(settings)
    webhooks = WebhookSender(settings.webhook_allow_private_targets)
    backoff = Backoff(
        settings.webhook_retry_initial_seconds, settings.webhook_retry_max_seconds, settings.webhook_retry_window_seconds
    )
    dispatcher = Dispatcher(
        runtime.pool,
        [InSiteChannel(), EmailChannel(settings), sms],
        settings.console_url,
        webhooks=webhooks,
        webhook_backoff=backoff,
    )

    relay = OutboxRelay(runtime.pool, settings, "alerts")  # the audit.v1 entries of rule writes
    service = AlertsService(
        AlertsStore(runtime.pool, relay),
        runtime.clock,
        settings.tz,
        check_target=partial(webhook.creation_refusal, allow_private=settings.webhook_allow_private_targets),
        deliver=dispatcher.fire,
        outside_messages_per_day=settings.alerts_outside_messages_per_day,
        max_rules=settings.alerts_max_rules_per_account,
    )

    # Keys that grow older than 90 days while nothing about them changes get their reminder here.
    reminders = Periodic(
        "alerts:rotation-reminders",
        settings.prune_interval_seconds,
        service.remind_rotations,
        what="posting rotation reminders",
        log=log,
    )

    budgets = Periodic(
        "alerts:outside-budgets",
        settings.prune_interval_seconds,
        service.forget_old_budgets,
        what="deleting old outside-message budgets",
        log=log,
    )

    async def stop() -> None:
        await budgets.stop()
        await reminders.stop()
        await dispatcher.stop()
        await relay.stop()
        await sms.close()
        await webhooks.close()

    component = Component(
        name="alerts",
        router=api.build_router(runtime, service),
        subscribers=consumers.build_router(service, runtime.broker, settings),
        migrations=Path(__file__).parent / "migrations",
        on_start=[relay.start, dispatcher.start, reminders.start, budgets.start],
        on_stop=[stop],
    )
    return component
