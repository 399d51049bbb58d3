"""Subscribers of the keys service: the account's plan (billing.v1) for GET /api/account, and
each key's last_used_at from calls.v1 (admitted calls only), in batches (one UPDATE per batch, off the request path)."""

import asyncio
from datetime import datetime
from typing import cast
from uuid import UUID

from faststream import AckPolicy
from faststream.kafka import KafkaBroker, KafkaRouter
from faststream.kafka.annotations import KafkaMessage

from contracts.events import BILLING_EVENTS, CallEvent, PlanChanged
from contracts.topics import BILLING, CALLS
from services.keys.service import KeysService
from services.runtime.platform.deadletter import parse_or_dead_letter
from services.runtime.platform.settings import Settings

LAST_USED_EVERY_S = 1.0


def subscribers(service: KeysService, broker: KafkaBroker, settings: Settings) -> KafkaRouter:
    router = KafkaRouter()

    @router.subscriber(
        settings.topic(BILLING.name),
        group_id=settings.group("keys.plans"),
        title="keys.plans",
        auto_offset_reset="earliest",
        ack_policy=AckPolicy.NACK_ON_ERROR,
    )
    async def on_billing(msg: KafkaMessage) -> None:
        event = await parse_or_dead_letter(broker, settings, BILLING, BILLING_EVENTS, cast(bytes, msg.body))
        if isinstance(event, PlanChanged):
            await service.set_plan(event.account_id, event.plan, event.time)

    @router.subscriber(
        settings.topic(CALLS.name),
        group_id=settings.group("keys.last-used"),
        title="keys.last-used",
        auto_offset_reset="earliest",
        batch=True,
        max_records=10_000,
        batch_timeout_ms=1000,
        ack_policy=AckPolicy.NACK_ON_ERROR,
    )
    async def on_calls(msg: KafkaMessage) -> None:
        used: dict[UUID, datetime] = {}
        for raw in cast(list[bytes], msg.body):
            event = await parse_or_dead_letter(broker, settings, CALLS, CallEvent, raw)
            if event is None or event.error_code is not None:
                continue  # refused calls (they carry error_code) do not move last_used_at (API.md)
            if event.api_key_id not in used or used[event.api_key_id] < event.time:
                used[event.api_key_id] = event.time
        await service.note_calls(used)  # GREATEST(): replays and reordering change nothing
        # last_used_at is coarse by nature: at most one UPDATE per second, whatever the call
        # rate (the next poll then returns the whole backlog as one batch).
        await asyncio.sleep(LAST_USED_EVERY_S)

    return router
