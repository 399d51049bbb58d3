"""Subscribers of the keys service: the account's plan (billing.v1) for GET /api/account, each
key's last_used_at from calls.v1 (admitted calls only), in batches (one UPDATE per batch, off the
request path), and the audit log (audit.v1, written by every service's outbox)."""

import asyncio
from datetime import datetime
from uuid import UUID

from faststream.kafka import KafkaBroker, KafkaRouter

from contracts.audit import AuditRecorded
from contracts.events import BILLING_EVENTS, BillingEvent, CallEvent, PlanChanged
from contracts.topics import AUDIT, BILLING, CALLS
from contracts.usage_rules import time_violations_at
from services.keys.service import KeysService
from services.runtime.platform.settings import Settings
from services.runtime.platform.subscribe import Reading, Subscriber

LAST_USED_EVERY_S = 1.0
# last_used_at is coarse by nature, and no latency bound waits on it: its calls.v1 fetches gather
# for up to a second (issue 38, decision 2), so a trickle of calls wakes the group once a second,
# not at every call's record (BENCHMARKS.md, "http_load" round 26).
LAST_USED_GATHER_MS = 1000


def build_router(service: KeysService, broker: KafkaBroker, settings: Settings) -> KafkaRouter:
    subscribe = Subscriber(KafkaRouter(), broker, settings)

    async def on_billing(event: BillingEvent) -> None:
        if isinstance(event, PlanChanged):
            await service.set_plan(event.account_id, event.plan, event.time, event.version)

    async def on_calls(events: list[CallEvent]) -> None:
        used: dict[UUID, datetime] = {}
        for event in events:
            if event.error_code is not None:
                continue  # refused calls (they carry error_code) do not move last_used_at (API.md)
            if event.api_key_id not in used or used[event.api_key_id] < event.time:
                used[event.api_key_id] = event.time
        await service.note_calls(used)  # GREATEST(): replays and reordering change nothing
        # last_used_at is coarse by nature: at most one UPDATE per second, whatever the call
        # rate (the next poll then returns the whole backlog as one batch).
        await asyncio.sleep(LAST_USED_EVERY_S)

    subscribe.each(BILLING, Reading(BILLING_EVENTS), group="keys.plans", handle=on_billing)
    # every service's audit entries (their outboxes): stored once per event id, committed after the write
    subscribe.each(AUDIT, Reading(AuditRecorded), group="keys.audit", handle=service.record_audit)
    # Calls judged as by every consumer of calls.v1 (contracts/usage_rules.py): a forged time far
    # ahead would otherwise hold last_used_at there (GREATEST).
    calls = Reading(CallEvent, lambda event, ms: time_violations_at(event, ms * 1000))
    subscribe.batches(
        {CALLS: calls},
        group="keys.last-used",
        handle=on_calls,
        max_records=10_000,
        batch_timeout_ms=1000,
        gather_ms=LAST_USED_GATHER_MS,
    )
    return subscribe.router
